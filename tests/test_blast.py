"""The blast workload: the blastgen kernel run for real with NCBI BLAST+ at a small size, its parser on
a golden output captured from that run (tests/data/blast_output.txt), and its parameters."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from pydantic import ValidationError

import marks
from virtlab.samples import ParseError
from virtlab.workloads import WORKLOADS
from virtlab.workloads._base import key_values
from virtlab.workloads.blast import Blast, BlastParams

DATA = Path(__file__).resolve().parent / "data"

# The size of the golden output and of the real runs below: 200 x 5000 bases, 20 queries of 500.
SMALL = {
    "db_sequences": 200,
    "sequence_length": 5000,
    "queries": 20,
    "query_length": 500,
    "mutation_rate": 0.05,
    "seed": 7,
}
# The database and queries depend on the seed only; the checksums pin them on every machine.
DB_FNV1A64 = "45e75949eb7dd1d7"
QUERY_FNV1A64 = "29dea39dec2efb89"
# Every query finds its source, and all but one a second, chance hit (e-value < 10). The chance
# hits depend on BLAST's statistics: this is BLAST+ 2.12.0 (Debian 12).
HITS = 41
SEED_OPTIONS = (
    "blastn -query q.fa -db db -task blastn -dust no -outfmt 7 -num_alignments 2 -num_descriptions 2"
)

needs_blast = marks.needs_tools("blastn", "makeblastdb")


def small() -> Blast:
    return Blast(BlastParams(**SMALL))


def golden() -> str:
    return (DATA / "blast_output.txt").read_text()


def run(argv: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False, env=env)


def fnv1a64(data: bytes) -> str:
    value = 0xCBF29CE484222325
    for byte in data:
        value = ((value ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{value:016x}"


def read_fasta(path: Path) -> list[tuple[str, str]]:
    records: list[tuple[str, list[str]]] = []
    for line in path.read_text().splitlines():
        if line.startswith(">"):
            records.append((line[1:], []))
        else:
            records[-1][1].append(line)
    return [(header, "".join(lines)) for header, lines in records]


def reverse_complement(bases: str) -> str:
    return bases[::-1].translate(str.maketrans("ACGT", "TGCA"))


# the kernel, for real


@needs_blast
def test_kernel_finds_every_query_source_with_pinned_counts(kernel_build, tmp_path):
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    done = run(small().command(str(kernel_build.bin_dir)), env)
    assert done.returncode == 0, done.stderr
    pairs = key_values(done.stdout)
    assert {key: pairs[key] for key in ("queries", "searched", "hits", "self_hits", "valid")} == {
        "queries": "20",
        "searched": "20",
        "hits": str(HITS),
        "self_hits": "20",
        "valid": "1",
    }
    assert (pairs["db_fnv1a64"], pairs["query_fnv1a64"]) == (DB_FNV1A64, QUERY_FNV1A64)
    assert (pairs["db_sequences"], pairs["db_letters"]) == ("200", "1000000")
    assert SEED_OPTIONS + " -out result.txt\n" in done.stderr
    assert "-num_threads" not in done.stderr
    # The default work directory is a fresh one under $TMPDIR, removed afterwards.
    assert list(tmp_path.iterdir()) == []
    [sample] = small().parse(done.stdout)
    assert sample.metadata["self_hits"] == 20 and sample.value > 0


@needs_blast
def test_kernel_is_deterministic_and_the_checksums_are_of_the_files(kernel_build, tmp_path):
    argv = small().command(str(kernel_build.bin_dir))
    outputs = []
    for name in ("first", "second"):
        done = run([*argv, "-w", str(tmp_path / name)])
        assert done.returncode == 0, done.stderr
        outputs.append(key_values(done.stdout))
    for key in ("hits", "self_hits", "db_fnv1a64", "query_fnv1a64"):
        assert outputs[0][key] == outputs[1][key]
    # A given work directory is kept, with the files the search used.
    first = tmp_path / "first"
    assert (first / "db.fa").read_bytes() == (tmp_path / "second" / "db.fa").read_bytes()
    assert fnv1a64((first / "db.fa").read_bytes()) == DB_FNV1A64
    assert fnv1a64((first / "q.fa").read_bytes()) == QUERY_FNV1A64
    assert (first / "result.txt").read_text().count("# Query: ") == 20


@needs_blast
def test_queries_are_cut_from_the_sequence_their_header_names(kernel_build, tmp_path):
    argv = Blast(BlastParams(**{**SMALL, "mutation_rate": 0.0})).command(str(kernel_build.bin_dir))
    done = run([*argv, "-w", str(tmp_path)])
    assert done.returncode == 0, done.stderr
    database = read_fasta(tmp_path / "db.fa")
    assert len(database) == 200 and {len(bases) for _, bases in database} == {5000}
    assert set("".join(bases for _, bases in database)) == set("ACGT")
    strands = set()
    for header, bases in read_fasta(tmp_path / "q.fa"):
        fields = dict(field.split("=") for field in header.split()[1:])
        index, offset = int(fields["source"].removeprefix("s")), int(fields["offset"])
        name, source = database[index]
        assert name.split()[0] == fields["source"]
        piece = source[offset : offset + 500]
        assert bases == (piece if fields["strand"] == "plus" else reverse_complement(piece))
        strands.add(fields["strand"])
    assert strands == {"plus", "minus"}
    # The database does not depend on the mutation rate.
    assert key_values(done.stdout)["db_fnv1a64"] == DB_FNV1A64


@needs_blast
def test_mutations_substitute_about_the_given_share_of_bases(kernel_build, tmp_path):
    argv = Blast(BlastParams(**SMALL)).command(str(kernel_build.bin_dir))
    done = run([*argv, "-w", str(tmp_path)])
    assert done.returncode == 0, done.stderr
    database = read_fasta(tmp_path / "db.fa")
    differ = total = 0
    for header, bases in read_fasta(tmp_path / "q.fa"):
        fields = dict(field.split("=") for field in header.split()[1:])
        offset = int(fields["offset"])
        piece = database[int(fields["source"].removeprefix("s"))][1][offset : offset + 500]
        if fields["strand"] == "minus":
            piece = reverse_complement(piece)
        differ += sum(a != b for a, b in zip(bases, piece, strict=True))
        total += len(bases)
    assert 0.04 < differ / total < 0.06  # 10000 bases at 5%: 500 +- 22


def test_kernel_refuses_bad_options(kernel_build):
    blastgen = str(kernel_build.path("blastgen"))
    for args in (["-l", "6000", "-L", "5000"], ["-m", "0.6"], ["-n", "0"], ["-s", "-1"], ["x"]):
        done = run([blastgen, *args])
        assert done.returncode == 2, args
        assert "usage" in done.stderr


def test_kernel_says_when_blast_is_missing(kernel_build, tmp_path):
    env = {"PATH": str(tmp_path / "empty"), "TMPDIR": str(tmp_path)}
    done = run([str(kernel_build.path("blastgen")), "-n", "2", "-L", "100", "-q", "1", "-l", "50"], env)
    assert done.returncode == 1
    assert "makeblastdb" in done.stderr and "ncbi-blast+" in done.stderr
    assert "elapsed_s=" not in done.stdout
    assert list(tmp_path.iterdir()) == []


# the parser, on the golden output


def test_parse_golden_output():
    [sample] = small().parse(golden())
    assert (sample.metric, sample.unit, sample.better) == ("elapsed_s", "s", "lower")
    assert sample.value == 0.125969
    assert sample.metadata == {
        "hits": HITS,
        "self_hits": 20,
        "queries": 20,
        "db_letters": 1_000_000,
        "user_s": 0.077194,
        "sys_s": 0.028915,
        "makeblastdb_s": 0.070377,
        "db_fnv1a64": DB_FNV1A64,
        "query_fnv1a64": QUERY_FNV1A64,
        "blastn_version": "2.12.0+",
    }


@pytest.mark.parametrize(
    ("replace", "message"),
    [
        (("self_hits=20", "self_hits=19"), "19 of 20 queries found their source"),
        (("hits=41", "hits=19"), "19 hits, fewer than one per query"),
        (("searched=20", "searched=12"), "reported 12 of 20 queries"),
        (("queries=20", "queries=10"), "queries=10 in the output, the parameters say 20"),
        (("db_letters=1000000", "db_letters=5"), "db_letters=5"),
        (("valid=1", "valid=0"), "valid=0"),
        (("elapsed_s=0.125969", "elapsed_s=nan"), "not a time"),
        ((" user_s=0.077194", ""), "incomplete"),
        (("elapsed_s=0.125969", "elapsed=0.1"), "no elapsed_s="),
    ],
)
def test_parse_refuses_a_wrong_run(replace, message):
    with pytest.raises(ParseError, match=message):
        small().parse(golden().replace(*replace))


def test_parse_refuses_output_of_other_parameters():
    with pytest.raises(ParseError, match="queries=20 in the output, the parameters say 1000"):
        Blast().parse(golden())
    with pytest.raises(ParseError, match="threads=1 in the output, the parameters say 2"):
        Blast(BlastParams(**SMALL, num_threads=2)).parse(golden())


def test_parse_refuses_empty_output():
    with pytest.raises(ParseError):
        small().parse("")


# parameters and command


def test_defaults_and_command():
    workload = Blast()
    assert workload.params == BlastParams(
        db_sequences=2000,
        sequence_length=5000,
        queries=1000,
        query_length=1000,
        mutation_rate=0.05,
        seed=1,
        num_threads=1,
    )
    assert workload.command("/opt/k") == [
        "/opt/k/blastgen", "-n", "2000", "-L", "5000", "-q", "1000", "-l", "1000",
        "-m", "0.05", "-s", "1", "-t", "1",
    ]  # fmt: skip
    assert (workload.kernels, workload.tools) == (("blastgen",), ("blastn", "makeblastdb"))


def test_registered_by_kind():
    assert WORKLOADS.get("blast") is Blast
    assert Blast.from_mapping({"queries": 5}).params.queries == 5


@pytest.mark.parametrize(
    "values",
    [
        {"query_length": 6000},
        {"mutation_rate": 0.3},
        {"mutation_rate": -0.1},
        {"db_sequences": 0},
        {"queries": 0},
        {"seed": -1},
        {"seed": 2**64},
        {"num_threads": 0},
        {"sequence_length": 10},
        {"dust": "no"},
    ],
)
def test_params_refuse(values):
    with pytest.raises(ValidationError):
        BlastParams(**values)


@needs_blast
def test_with_threads_blastn_gets_num_threads(kernel_build, tmp_path):
    argv = Blast(BlastParams(**SMALL, num_threads=2)).command(str(kernel_build.bin_dir))
    done = run([*argv, "-w", str(tmp_path)])
    assert done.returncode == 0, done.stderr
    assert SEED_OPTIONS + " -out result.txt -num_threads 2\n" in done.stderr
    [sample] = Blast(BlastParams(**SMALL, num_threads=2)).parse(done.stdout)
    assert sample.metadata["hits"] == HITS


@pytest.mark.slow
def test_blast_runs_the_same_in_native_and_a_container(tmp_path, guest_image):
    """The guest userland carries ncbi-blast+, so the very same run works in a container."""
    import json

    from virtlab.plan import parse_plan
    from virtlab.study import run_study

    params = "\n".join(f"{key} = {value}" for key, value in SMALL.items())
    plan = parse_plan(
        '[study]\nname = "blast"\ntrials = 1\nwarmups = 0\n'
        '[[environment]]\nname = "native"\nkind = "native"\n'
        '[[environment]]\nname = "container"\nkind = "container"\n'
        f'[[workload]]\nname = "blast"\nkind = "blast"\n{params}\n',
        "blast.toml",
    )
    outcome = run_study(plan, tmp_path / "out")
    assert outcome.exit_code == 0
    cells = json.loads((tmp_path / "out" / "results.json").read_text())["cells"]
    blast = {c["environment"]: c for c in cells if c["workload"] == "blast"}
    assert set(blast) == {"native", "container"}
    assert all(c["value"] > 0 for c in blast.values())
