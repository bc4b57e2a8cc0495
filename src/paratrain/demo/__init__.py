"""The embedded demo job: a small CNN on scikit-learn's digits, trained with DDP.

    paratrain demo                    # 2 CPU ranks (or every GPU), ~20 s on a laptop CPU
    paratrain demo --epochs 5 --strategy fsdp --run-dir runs/demo-fsdp

Steps: launch ``paratrain.demo.train`` on N ranks through torchrun; evaluate on the held-out set
with the exact-once eval loader; save the weights; reload them in a fresh single CPU process
(``paratrain.demo.evaluate``) and check both accuracies; plot the curves.
"""
