import torch, io, contextlib, cProfile, pstats
from paratrain.bench.models import build_spec
from paratrain.bench.loops import Config, Settings
from paratrain.bench import measure
measure.steady_allocator()
spec = build_spec("mlp", width=512, depth=6)
st = Settings(batch_size=32, steps=20, warmup=10, rounds=8, data="synthetic", budget_s=20)
with contextlib.redirect_stdout(io.StringIO()):
    ours = measure.paratrain_loop(spec, Config("pipeline", "fp32", 1), st)
measure._timed_steps(ours, 50)
pr = cProfile.Profile(); pr.enable()
measure._timed_steps(ours, 300)
pr.disable()
s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("cumulative").print_stats(40); print(s.getvalue()[:7000])
