"""``dslaunch.elasticity``, as ``deepspeed.elasticity``: the elastic batch solver by DeepSpeed's
names (``compute_elastic_config``, ``elasticity_enabled``, ``ensure_immutable_elastic_config``;
the errors in ``config``). A face: the solver is the config's (``dslaunch/config/elasticity.py``),
the one ``dslaunch.initialize`` and ``dslaunch run --elastic`` use."""

from dslaunch.deepspeed_names import face_getattr
from dslaunch.elasticity.elasticity import compute_elastic_config, elasticity_enabled, ensure_immutable_elastic_config

__all__ = ["compute_elastic_config", "elasticity_enabled", "ensure_immutable_elastic_config"]

__getattr__ = face_getattr(__name__)
