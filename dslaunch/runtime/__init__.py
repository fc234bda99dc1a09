"""``dslaunch.runtime``, as ``deepspeed.runtime``: faces for the runtime modules that scripts
import by their runtime path (``runtime.engine``, ``runtime.pipe``, ``runtime.lr_schedules``,
``runtime.base_optimizer``,
``runtime.zero``, ``runtime.utils``, ``runtime.dataloader``, ``runtime.sequence_parallel``), not a mirror of DeepSpeed's
package. Which names answer, and from where, is ``dslaunch/deepspeed_names.py``.
"""

from dslaunch.deepspeed_names import face_getattr

__getattr__ = face_getattr(__name__)  # submodules as DeepSpeed's `import deepspeed` leaves them
