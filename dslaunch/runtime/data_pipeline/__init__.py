"""``dslaunch.runtime.data_pipeline``, as ``deepspeed.runtime.data_pipeline``: the curriculum
scheduler (``curriculum_scheduler``); data sampling and routing are not provided yet. Which names
answer is ``dslaunch/deepspeed_names.py``.
"""

from dslaunch.deepspeed_names import face_getattr

__getattr__ = face_getattr(__name__)
