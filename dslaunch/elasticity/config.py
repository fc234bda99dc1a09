"""``deepspeed.elasticity.config``: the errors ``compute_elastic_config`` raises, under
DeepSpeed's names (ElasticityConfigError and ElasticityIncompatibleWorldSize are
ElasticityErrors)."""


class ElasticityError(Exception):
    """The elasticity section cannot be used as asked."""


class ElasticityConfigError(ElasticityError):
    """The elasticity section is missing, disabled or invalid; the message names the key."""


class ElasticityIncompatibleWorldSize(ElasticityError):
    """The world size is not one the elastic batch size can be trained at."""
