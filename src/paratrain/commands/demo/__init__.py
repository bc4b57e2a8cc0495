"""The embedded demo job: a small CNN on scikit-learn's digits, trained with DDP.

    paratrain demo                    # 2 CPU ranks (or every GPU): about 30 s on 2 CPU cores
    paratrain demo --skip-resume      # no crash and no second run: about 20 s
    paratrain demo --epochs 5 --strategy fsdp --run-dir runs/demo-fsdp

Steps: launch ``paratrain.commands.demo.train`` on N ranks through torchrun, with a checkpoint
after every epoch; kill one rank halfway, so that torchrun's restart resumes from the newest
checkpoint; evaluate on the held-out set with the exact-once eval loader; save the weights and
reload them in a fresh single CPU process (``paratrain.commands.demo.evaluate``); train once more
without the crash and compare the two runs bit for bit (``paratrain.commands.demo.resume_check``);
plot the curves.
"""
