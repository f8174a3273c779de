"""Scenarios: studies that are not an environment x workload grid.

A plan names one in ``[study] scenario = "<name>"`` and configures it in a top-level table of the
same name (``[priority]``), validated by the scenario's own model (unknown keys refused). The plan's
``[[environment]]`` and ``[[workload]]`` tables then describe what the scenario builds from (the
priority scenario: the guest template and the workload every guest runs), and ``virtlab run`` runs
the scenario's study instead of the grid, with the same results directory, ``--resume`` and exit
codes.

A scenario is a ``virtlab.study.Study`` subclass (most are ``RunsStudy``: a study made of stored
runs) registered by name in ``virtlab.scenario_kinds``; it gives::

    Config            pydantic model of its table (extra="forbid")
    check(...)        problems between its table and the rest of the plan, found while parsing
    preflight(plan, out_dir)  problems of this host, found before anything runs (InputError), -> kernels
    its runs, its section of results.json and its reports
"""
