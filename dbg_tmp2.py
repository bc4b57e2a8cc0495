import torch, io, contextlib, sys
from paratrain.bench.models import build_spec
from paratrain.bench.loops import Config, Settings
from paratrain.bench import measure
spec = build_spec("mlp", width=512, depth=6)
st = Settings(batch_size=32, steps=20, warmup=10, rounds=8, data="synthetic", budget_s=20)
for s in sys.argv[1:]:
    with contextlib.redirect_stdout(io.StringIO()):
        r = measure.measure_config(spec, Config(s, "fp32", 1), st)
    print(s, round(r["overhead_ratio"],3), round(r["ratio_low"],3), round(r["ratio_high"],3), r["pairs"])
