"""BLAST (seed 000 section 4.3): blastn searching a small generated nucleotide database, seconds.

The seed timed ``blastn -task blastn -dust no -outfmt 7 -num_alignments 2 -num_descriptions 2``
against a small RefSeq RNA database. Here the database is generated reproducibly by the
``blastgen`` kernel inside the environment (random sequences from a fixed seed, indexed with
makeblastdb), with queries cut from known places in it and mutated, so that only the search is
timed and every query has a known right answer: its own source sequence as the top hit.
"""

from __future__ import annotations

import math
from typing import ClassVar

from pydantic import Field, model_validator

from virtlab.samples import ParseError, Sample
from virtlab.workloads._base import Workload, WorkloadParams, key_values, register_workload

_COUNTS = ("queries", "searched", "hits", "self_hits", "db_sequences", "db_letters", "threads")
_TIMES = ("elapsed_s", "user_s", "sys_s", "makeblastdb_s")


class BlastParams(WorkloadParams):
    db_sequences: int = Field(
        default=2000, ge=1, le=10_000_000, description="sequences in the generated database"
    )
    sequence_length: int = Field(
        default=5000,
        ge=50,
        le=100_000_000,
        description="bases per database sequence (the default database is 10^7 bases, ~10 MB)",
    )
    queries: int = Field(default=1000, ge=1, le=100_000, description="query sequences searched")
    query_length: int = Field(
        default=1000, ge=50, le=100_000_000, description="bases per query, at most sequence_length"
    )
    mutation_rate: float = Field(
        default=0.05,
        ge=0.0,
        le=0.2,
        description="probability that a query base differs from its source; beyond 0.2 the "
        "source is no longer sure to be the top hit",
    )
    seed: int = Field(default=1, ge=0, le=2**64 - 1, description="PRNG seed of the database and the queries")
    num_threads: int = Field(default=1, ge=1, le=1024, description="blastn -num_threads")

    @model_validator(mode="after")
    def _queries_fit(self) -> BlastParams:
        if self.query_length > self.sequence_length:
            raise ValueError(
                f"query_length {self.query_length} exceeds sequence_length {self.sequence_length}: "
                "queries are cut from database sequences"
            )
        return self


@register_workload
class Blast(Workload):
    kind: ClassVar[str] = "blast"
    summary: ClassVar[str] = (
        "blastn (NCBI BLAST+) with the seed's options on a generated database, hits checked, seconds"
    )
    Params: ClassVar[type[WorkloadParams]] = BlastParams
    kernels: ClassVar[tuple[str, ...]] = ("blastgen",)
    tools: ClassVar[tuple[str, ...]] = ("blastn", "makeblastdb")
    params: BlastParams

    def command(self, bin_dir: str) -> list[str]:
        p = self.params
        return [
            f"{bin_dir}/blastgen",
            "-n", str(p.db_sequences),
            "-L", str(p.sequence_length),
            "-q", str(p.queries),
            "-l", str(p.query_length),
            "-m", repr(p.mutation_rate),
            "-s", str(p.seed),
            "-t", str(p.num_threads),
        ]  # fmt: skip

    def parse(self, output: str) -> list[Sample]:
        pairs = key_values(output)
        if "elapsed_s" not in pairs:
            raise ParseError("blast: no elapsed_s= in the output (did blastn run?)")
        try:
            counts = {key: int(pairs[key]) for key in _COUNTS}
            times = {key: float(pairs[key]) for key in _TIMES}
            checksums = {key: pairs[key] for key in ("db_fnv1a64", "query_fnv1a64")}
        except (KeyError, ValueError) as error:
            raise ParseError(f"blast: incomplete result line ({error})") from None
        self._check(counts, times)
        if pairs.get("valid") != "1":
            raise ParseError(f"blast: the kernel rejected the search (valid={pairs.get('valid')})")
        metadata = {
            **{key: counts[key] for key in ("hits", "self_hits", "queries", "db_letters")},
            **{key: times[key] for key in ("user_s", "sys_s", "makeblastdb_s")},
            **checksums,
            "blastn_version": pairs.get("blastn_version", "unknown"),
        }
        return [Sample("elapsed_s", times["elapsed_s"], "s", "lower", metadata)]

    def _check(self, counts: dict[str, int], times: dict[str, float]) -> None:
        """The output must be of this workload's database and queries, and every query must have
        found its own source first: otherwise a broken search would count as a fast one."""
        p = self.params
        expected = {
            "queries": p.queries,
            "db_sequences": p.db_sequences,
            "db_letters": p.db_sequences * p.sequence_length,
            "threads": p.num_threads,
        }
        for key, value in expected.items():
            if counts[key] != value:
                raise ParseError(f"blast: {key}={counts[key]} in the output, the parameters say {value}")
        if counts["searched"] != p.queries:
            raise ParseError(f"blast: blastn reported {counts['searched']} of {p.queries} queries")
        if counts["self_hits"] != p.queries:
            raise ParseError(
                f"blast: only {counts['self_hits']} of {p.queries} queries found their source "
                "sequence as the top hit"
            )
        if counts["hits"] < p.queries:
            raise ParseError(f"blast: {counts['hits']} hits, fewer than one per query ({p.queries})")
        for key, value in times.items():
            if not (math.isfinite(value) and value >= 0):
                raise ParseError(f"blast: {key}={value} is not a time")
