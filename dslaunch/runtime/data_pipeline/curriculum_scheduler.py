"""``dslaunch.runtime.data_pipeline.curriculum_scheduler``, as DeepSpeed's: the difficulty
schedule of curriculum learning. A face: the implementation is ``dslaunch/engine/features/curriculum.py``.
"""

from dslaunch.engine.features.curriculum import CurriculumScheduler

__all__ = ["CurriculumScheduler"]


def __getattr__(name):  # a DeepSpeed name we do not provide: say what brings it
    from dslaunch.deepspeed_names import missing_attribute

    raise missing_attribute(__name__, name)
