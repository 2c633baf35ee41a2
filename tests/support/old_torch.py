"""Stand-ins for the APIs of the oldest torch ddplab supports, for tests that run on a newer one.

`LaunchConfig` of torch 2.4 (torch/distributed/launcher/api.py at v2.4.0) had these fields
only; later releases added the rest (event_log_handler, numa_options, signals_to_handle,
duplicate_*_filters, virtual_local_rank, shutdown_timeout). `old_launch_config_class()`
builds a dataclass whose constructor takes exactly the old fields, as the old one did, and
whose instances still carry the newer attributes at their defaults, so today's
`elastic_launch` can run with it.
"""

import dataclasses

OLDEST = "2.4"
LAUNCH_CONFIG_FIELDS_2_4 = (
    "min_nodes",
    "max_nodes",
    "nproc_per_node",
    "logs_specs",
    "run_id",
    "role",
    "rdzv_endpoint",
    "rdzv_backend",
    "rdzv_configs",
    "rdzv_timeout",
    "max_restarts",
    "monitor_interval",
    "start_method",
    "log_line_prefix_template",
    "metrics_cfg",
    "local_addr",
)


def old_launch_config_class():
    from torch.distributed.launcher.api import LaunchConfig

    current = {f.name: f for f in dataclasses.fields(LaunchConfig)}
    missing = set(LAUNCH_CONFIG_FIELDS_2_4) - set(current)
    assert not missing, f"torch dropped LaunchConfig fields {missing}: update this stand-in"
    kept = [(name, f.type, f) for name, f in current.items() if name in LAUNCH_CONFIG_FIELDS_2_4]
    newer = {
        name: (f.default if f.default is not dataclasses.MISSING else f.default_factory())
        for name, f in current.items()
        if name not in LAUNCH_CONFIG_FIELDS_2_4
    }
    return dataclasses.make_dataclass(
        "LaunchConfig", kept, bases=(), namespace={**newer, "__post_init__": LaunchConfig.__post_init__}
    )


def use_old_launch_config():
    """Install the stand-in where ddplab looks it up (torch.distributed.launcher.api)."""
    import torch.distributed.launcher.api as api

    api.LaunchConfig = old_launch_config_class()
