"""AdaptDLTrainableCreator: a training function as a Tune trainable of N data-parallel
replicas, and what the scheduler reads of such a trainable (its replicas' spec, its stop
timeout). The trial's runtime is :class:`~adaptdl_ray.tune.trainable.AdaptDLTrainable`.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Mapping

from adaptdl_core import validation
from adaptdl_core.decision.jobs import JobSpec
from adaptdl_ray.tune.trainable import DEFAULT_CHECKPOINT_INTERVAL_S, AdaptDLTrainable

__all__ = ["AdaptDLTrainableCreator", "is_adaptdl_trainable", "replica_spec_of",
           "stop_timeout_of"]


def is_adaptdl_trainable(trainable_cls: Any) -> bool:
    """True for a class made by :func:`AdaptDLTrainableCreator` (or a Tune wrapper of one,
    such as ``tune.with_parameters``)."""
    return isinstance(trainable_cls, type) and issubclass(trainable_cls, AdaptDLTrainable) \
        and trainable_cls.adaptdl_replica_spec is not None


def replica_spec_of(trainable_cls: Any) -> JobSpec:
    """The :class:`JobSpec` of an AdaptDL trainable.

    Raises:
        TypeError: if ``trainable_cls`` was not made by :func:`AdaptDLTrainableCreator`
            (the message says how to wrap a training function, or a Ray Train trainer's).
    """
    if not is_adaptdl_trainable(trainable_cls):
        name = getattr(trainable_cls, "__name__", repr(trainable_cls))
        if "Trainer" in name:
            raise TypeError(
                f"AdaptDLScheduler cannot resize a Ray Train {name}: Ray Train fixes the "
                "number of workers. Run the same function elastically with "
                "tune.Tuner(AdaptDLTrainableCreator(train_loop_per_worker, "
                "num_cpus_per_worker=..., num_gpus_per_worker=...), param_space="
                "{'train_loop_config': ...}) - see 'Coming from Ray Train' in docs/migrating.md")
        raise TypeError(f"AdaptDLScheduler can only schedule trainables created with "
                        f"adaptdl_ray.tune.AdaptDLTrainableCreator(train_fn); got {name}. "
                        "Wrap your training function: "
                        "tune.Tuner(AdaptDLTrainableCreator(train_fn), ...)")
    return trainable_cls.adaptdl_replica_spec


def stop_timeout_of(trainable_cls: Any) -> float:
    """How long a checkpoint of an AdaptDL trainable's trial may wait for a batch boundary
    (its creator's ``stop_timeout_s``).

    Raises:
        TypeError: as :func:`replica_spec_of`.
    """
    replica_spec_of(trainable_cls)
    return trainable_cls.adaptdl_stop_timeout_s


def _check_seconds(name: str, value: Any, *, optional: bool = False) -> None:
    """A finite number of seconds > 0 (or ``None`` where ``optional``)."""
    if optional and value is None:
        return
    validation.number(name, value, 0.0, low_open=True, what="a finite number of seconds")


def _custom_resources(extra: Any, num_cpus: Any, num_gpus: Any) -> dict[str, float]:
    """``resources_per_worker`` checked: a dict of custom resource name -> finite amount
    ``>= 0`` that leaves CPUs and GPUs to their own arguments (a ``"CPU"`` entry once
    replaced ``num_cpus_per_worker`` without a word)."""
    if extra is None:
        return {}
    if not isinstance(extra, Mapping):
        raise ValueError(f"resources_per_worker must be a dict of custom resource name -> "
                         f"amount per replica (e.g. {{'TPU': 1}}) or None, got {extra!r}")
    own = {"CPU": ("num_cpus_per_worker", num_cpus), "GPU": ("num_gpus_per_worker", num_gpus)}
    out = {}
    for key, value in extra.items():
        # Ray's names are case-sensitive: {'cpu': 2} would ask for a custom resource no node
        # has, and the trial would wait for ever.
        upper = key.upper() if isinstance(key, str) else None
        if upper in own:
            arg, given = own[upper]
            raise ValueError(f"resources_per_worker[{key!r}]={value!r} conflicts with {arg}="
                             f"{given!r}: give {upper}s per replica with {arg} only")
        if not isinstance(key, str) or not key:
            raise ValueError(f"resources_per_worker: resource names must be non-empty "
                             f"strings, got {key!r}")
        out[key] = validation.number(f"resources_per_worker[{key!r}]", value, 0.0)
    return out


def AdaptDLTrainableCreator(train_fn: Callable[..., Any], *,  # noqa: N802 (AdaptDL's name)
                            num_cpus_per_worker: float = 1.0, num_gpus_per_worker: float = 0.0,
                            resources_per_worker: Mapping[str, float] | None = None,
                            min_replicas: int = 1, max_replicas: int | None = None,
                            stop_timeout_s: float = 120.0,
                            collective_timeout_s: float | None = None,
                            single_replica_in_process: bool = True,
                            checkpoint_interval_s: float | None =
                            DEFAULT_CHECKPOINT_INTERVAL_S,
                            name: str | None = None) -> type[AdaptDLTrainable]:
    """Make a Tune trainable that runs ``train_fn(config)`` on N data-parallel replicas.

    ``train_fn`` is an ordinary adaptdl_core training function (``init_process_group``,
    ``AdaptiveDataParallel``, ``AdaptiveDataLoader``, ``remaining_epochs_until``...) that
    calls ``ray.tune.report(metrics, checkpoint=...)``; only rank 0's reports reach Tune,
    with the ``adaptdl/...`` metrics added. The number of replicas is the number of bundles
    after the head bundle of the trial's placement group, which :class:`AdaptDLScheduler`
    sets.

    Args:
        train_fn: ``fn(config)`` (or ``fn(config, **kwargs)`` with ``tune.with_parameters``,
            wrapped around the function or around the returned trainable); it is pickled
            and run in each worker actor.
        num_cpus_per_worker: CPUs of each replica's bundle (also its torch threads).
        num_gpus_per_worker: GPUs of each replica's bundle.
        resources_per_worker: extra custom resources per replica (``{"TPU": 1}``; CPUs and
            GPUs are given by the two arguments above).
        min_replicas, max_replicas: bounds on the replica count (``max`` ``None``: the
            cluster is the limit).
        stop_timeout_s: how long a checkpoint may wait for the replicas to reach a batch
            boundary (also bounds the save on an interrupt of the driver).
        collective_timeout_s: ``ADAPTDL_TIMEOUT`` for the replicas (default: the core's 30 s).
        single_replica_in_process: run the replica of a one-replica launch inside the trial
            actor (saves starting a second process and importing torch twice) when it needs
            only CPUs. The function then runs in a thread of the trial actor: set False if
            it must have a process of its own (e.g. it changes process-wide settings that
            must not outlive the trial, or may kill its process on purpose).
        checkpoint_interval_s: seconds of training between in-place checkpoints (the
            replicas train on while rank 0 writes; each is also written to the trial's
            directory on the run's storage): the most a node lost without notice costs,
            since the trial continues from the newest one in its own placement group, and
            a retry or restore after the trial actor's own node was lost resumes from it;
            ``None``: none (a lost node then costs everything since the launch began, or
            since Tune's last checkpoint).
        name: the trainable's name in Tune (trial names start with it); default
            ``AdaptDL_<function name>``.

    Returns:
        a subclass of :class:`AdaptDLTrainable` to pass to ``tune.run`` or ``tune.Tuner``.

    Raises:
        ValueError: for a non-callable ``train_fn``, a function that cannot take a config
            argument, non-finite or negative resources or timeouts, a
            ``resources_per_worker`` that is not a dict or names ``"CPU"`` / ``"GPU"``
            (those are ``num_cpus_per_worker`` / ``num_gpus_per_worker``), or
            ``min_replicas > max_replicas`` (the message names the argument).
    """
    if not callable(train_fn) or isinstance(train_fn, type):
        raise ValueError(f"train_fn must be a function fn(config), got "
                         f"{type(train_fn).__name__}: pass the training function itself")
    try:
        inspect.signature(train_fn).bind({})
    except TypeError:
        raise ValueError(f"train_fn {getattr(train_fn, '__name__', train_fn)!r} must accept "
                         "one argument (the trial's config dict)") from None
    except ValueError:
        pass  # builtins without a signature: let them fail at run time
    for arg, value in (("num_cpus_per_worker", num_cpus_per_worker),
                       ("num_gpus_per_worker", num_gpus_per_worker)):
        validation.number(arg, value, 0.0)
    _check_seconds("stop_timeout_s", stop_timeout_s)
    _check_seconds("collective_timeout_s", collective_timeout_s, optional=True)
    _check_seconds("checkpoint_interval_s", checkpoint_interval_s, optional=True)
    if not isinstance(single_replica_in_process, bool):
        raise ValueError(f"single_replica_in_process must be True or False, got "
                         f"{single_replica_in_process!r}")
    if name is not None and (not isinstance(name, str) or not name):
        raise ValueError(f"name must be a non-empty string or None, got {name!r}")
    resources = {"CPU": float(num_cpus_per_worker), "GPU": float(num_gpus_per_worker)}
    resources.update(_custom_resources(resources_per_worker, num_cpus_per_worker,
                                       num_gpus_per_worker))
    spec = JobSpec(resources, min_replicas=min_replicas, max_replicas=max_replicas)
    cls_name = name or f"AdaptDL_{getattr(train_fn, '__name__', 'trainable')}"
    return type(cls_name, (AdaptDLTrainable,), {
        "_adaptdl_fn": staticmethod(train_fn),
        "adaptdl_replica_spec": spec,
        "adaptdl_stop_timeout_s": float(stop_timeout_s),
        "_adaptdl_collective_timeout_s": collective_timeout_s,
        "adaptdl_single_replica_in_process": bool(single_replica_in_process),
        "adaptdl_checkpoint_interval_s": None if checkpoint_interval_s is None
        else float(checkpoint_interval_s),
        "__doc__": f"AdaptDL trainable running {cls_name} on N data-parallel replicas.",
    })
