"""What runs inside training processes (launched by torchrun / deepspeed, possibly on other machines).

No Dagster import here except `dagster_pipes`; the only Kiln module it may use is the shard format.
"""
