"""``dslaunch.runtime.data_pipeline``, as ``deepspeed.runtime.data_pipeline``: the curriculum
scheduler (``curriculum_scheduler``), the ``data_efficiency`` config (``config``, ``constants``),
data sampling (``data_sampling``) and data routing (``data_routing``). Which names answer is
``dslaunch/deepspeed_names.py``.
"""

from dslaunch.deepspeed_names import face_getattr

__getattr__ = face_getattr(__name__)
