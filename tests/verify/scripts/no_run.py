"""A script that never creates paratrain.Run: there is nothing verify-resume can check."""

print("training by hand")
