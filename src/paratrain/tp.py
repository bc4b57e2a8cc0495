"""``paratrain.tp``: tensor-parallel plans, under the name the docs use (see
:mod:`paratrain.plans.tp`).

    import paratrain as pt
    plan = pt.tp.mlp("blocks.*.mlp", up="fc1", down="fc2") | pt.tp.attention("blocks.*.attn")
"""

from paratrain.plans.tp import STYLES, PlanSetting, TPPlan, attention, mlp, output

__all__ = ["STYLES", "PlanSetting", "TPPlan", "attention", "mlp", "output"]
