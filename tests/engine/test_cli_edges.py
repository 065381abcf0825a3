"""The command line's rough edges, as a newcomer meets them, run as real
subprocesses: every bad input is one line on stderr and exit code 2, and
nothing is created on the way."""

from __future__ import annotations

import re
import socket
from pathlib import Path

import pytest
import typer.main

from test_cli import SHAPE, assert_one_line_error, ws_tune
from ws_tuner.database_url import check_db_url

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("env", [False, True])
def test_a_db_that_is_neither_url_nor_sqlite_path_is_refused_and_nothing_is_created(tmp_path, env):
    args, extra = (["db", "current"], {"WS_TUNE_DB": "not a url"}) if env else (["db", "current", "--db", "not a url"], {})
    proc = ws_tune(*args, cwd=tmp_path, env=extra)
    assert_one_line_error(proc, "'not a url' is neither a database URL")
    assert ("WS_TUNE_DB" if env else "--db") in proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_an_unsupported_scheme_names_what_is_supported(tmp_path):
    proc = ws_tune("db", "current", "--db", "mysql://root:hunter2@localhost/db", cwd=tmp_path)
    assert_one_line_error(proc, "unsupported database mysql://")
    assert "hunter2" not in proc.stderr and "PostgreSQL" in proc.stderr


@pytest.mark.parametrize(
    "given, spelled",
    [
        ("postgres://u@h/db", "postgresql+psycopg://u@h/db"),
        ("postgresql://u@h/db", "postgresql+psycopg://u@h/db"),
        ("postgres+psycopg://u@h/db", "postgresql+psycopg://u@h/db"),
        ("results.db", "results.db"),
        ("sqlite:///x", "sqlite:///x"),
    ],
)
def test_database_spellings(given, spelled):
    assert check_db_url(given) == spelled


@pytest.mark.postgres
def test_postgres_scheme_opens_postgresql(pg_database, tmp_path):
    url = pg_database.set(drivername="postgres").render_as_string(hide_password=False)
    proc = ws_tune("db", "upgrade", "--db", url, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "is at schema revision" in proc.stdout


def test_a_taken_port_is_one_line_and_exit_2(tmp_path):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        proc = ws_tune("serve", "--port", str(port), "--db", str(tmp_path / "s.db"), "--workers", "0")
    assert_one_line_error(proc, f"port {port} on 127.0.0.1 is in use")


@pytest.mark.parametrize("typo, suggestion", [("spcae", "space"), ("bset", "best"), ("serev", "serve")])
def test_a_mistyped_command_is_not_read_as_a_kernel_file(typo, suggestion, example_path):
    proc = ws_tune(typo, str(example_path), "--shape", SHAPE)
    assert_one_line_error(proc, f"unknown command {typo!r}; did you mean {suggestion}?")


def test_a_word_like_no_command_lists_the_commands(example_path):
    proc = ws_tune("frobnicate", str(example_path))
    assert_one_line_error(proc, "unknown command 'frobnicate' (commands: ")
    assert "space" in proc.stderr


def test_version():
    from ws_tuner import __version__

    proc = ws_tune("--version")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"ws-tune {__version__}"


def _commands(group, prefix=""):
    for name, command in group.commands.items():
        if hasattr(command, "commands"):
            yield from _commands(command, f"{prefix}{name} ")
        else:
            yield f"{prefix}{name}", command


def test_every_argument_and_option_has_help():
    from ws_tuner.cli import app

    missing = [
        f"{path}: {param.name}"
        for path, command in _commands(typer.main.get_command(app))
        for param in command.params
        if not getattr(param, "hidden", False) and not (getattr(param, "help", None) or "").strip()
    ]
    assert missing == []


def test_export_help_says_what_each_option_is():
    proc = ws_tune("export", "--help", env={"COLUMNS": "200"})
    assert proc.returncode == 0, proc.stderr
    for needle in ("Kernel file that was tuned", "JSON file to write", "How many of the fastest", "Device whose results"):
        assert needle in proc.stdout, proc.stdout


def test_export_with_nothing_stored_exits_1_like_best_and_writes_nothing(tmp_path, example_path):
    db, out = tmp_path / "r.db", tmp_path / "best.json"
    for command in (["best"], ["export", "-o", str(out)]):
        proc = ws_tune(*command, str(example_path), "--shape", SHAPE, "--db", str(db), "--device", "compile-only")
        assert_one_line_error(proc, "no timed result stored for gemm", code=1)
        assert "compile-only tunings (no GPU) verify and build candidates but time nothing" in proc.stderr
    assert not out.exists()


def test_untimed_note_names_what_is_stored():
    from ws_tuner.workload import COMPILE_ONLY_DEVICE, Environment, WorkloadKey, untimed_note

    def key(device):
        return WorkloadKey.make("k", "ab" * 32, {"M": 1}, Environment("sm_90a", device, "t", "c", "d"))

    assert untimed_note("NVIDIA H200", []) == ""
    note = untimed_note("NVIDIA H200", [key(d).device for d in (COMPILE_ONLY_DEVICE, "NVIDIA H100", "NVIDIA H200")])
    assert "time nothing" in note and "results exist for device 'NVIDIA H100'" in note and "H200" not in note


# --- service settings -------------------------------------------------------------


def _serve(tmp_path, env, db=True):
    return ws_tune("serve", *(["--db", str(tmp_path / "s.db")] if db else []), "--workers", "0", "--port", "1", cwd=ROOT, env=env)


def test_a_typo_in_the_config_file_names_the_setting(tmp_path):
    config = tmp_path / "service.toml"
    config.write_text((ROOT / "configs" / "service.toml").read_text() + "\nheartbeat_intervall = 2.0\n")
    proc = _serve(tmp_path, {"WS_TUNE_CONFIG": str(config)})
    assert_one_line_error(proc, f"unknown setting 'heartbeat_intervall' in {config}; did you mean heartbeat_interval?")


def test_an_unknown_ws_tune_variable_names_the_nearest(tmp_path):
    proc = _serve(tmp_path, {"WS_TUNE_GRACE_PERIOUD": "3"})
    assert_one_line_error(proc, "unknown environment variable WS_TUNE_GRACE_PERIOUD; did you mean WS_TUNE_GRACE_PERIOD?")


def test_the_shipped_config_and_env_example_load(monkeypatch):
    from ws_tuner.server.config import load_settings

    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("WS_TUNE_CONFIG", str(ROOT / "configs" / "service.toml"))
    assert load_settings().kernel_dirs == [Path("examples")]
    monkeypatch.delenv("WS_TUNE_CONFIG")
    example = ROOT / "configs" / "service.env.example"
    for line in example.read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.partition("=")
            if value:
                monkeypatch.setenv(name, value)
    settings = load_settings()
    assert settings.db.startswith("postgresql+psycopg://") and settings.grace == 15.0


def test_a_bad_db_in_the_service_settings_is_one_line(tmp_path):
    proc = _serve(tmp_path, {"WS_TUNE_DB": "oops"}, db=False)
    assert_one_line_error(proc, "'oops' is neither a database URL")


def test_a_baseline_faster_than_every_searched_schedule_is_named():
    from ws_tuner.candidate import Candidate, Lowering
    from ws_tuner.cli.tuning import faster_baselines
    from ws_tuner.pipeline import BASELINE, SEARCH, TrialRecord
    from ws_tuner.result import Status, TrialResult

    def record(params: dict, lowering: Lowering, ratio: float, role: str) -> TrialRecord:
        cand = Candidate.make(params, None, lowering)
        return TrialRecord(cand, TrialResult(cand.hash, Status.OK, ratio=ratio, confirmed=True), role)

    best = record({"block_N": 128}, Lowering.DEFAULT, 1.0, SEARCH)  # stands in for the best searched schedule
    default = record({"block_N": 64}, Lowering.DEFAULT, 0.95, BASELINE)
    role_based = record({"block_N": 64}, Lowering.ROLE_BASED, 0.995, BASELINE)  # within the tournament's 1%
    lines = faster_baselines([("ws-tune best", best), ("default", default), ("role_based", role_based), ("reference", None)], best)
    assert len(lines) == 1 and lines[0].startswith("note: default (") and "5.3% faster" in lines[0]


def test_user_text_with_brackets_is_printed_as_it_is():
    """Candidate labels ("[default] ..."), T.WSSchedule code ("[data_shared]") and
    error messages go through rich: none of their brackets may be read as markup."""
    from ws_tuner.cli.common import err, out, print_error

    text = "note: [default] block_M=64 | T.WSPipeline('data_shared', [data_shared], depth=3)"
    for console in (out, err):
        with console.capture() as captured:
            console.print(text)
        assert captured.get().strip() == text
    with err.capture() as captured:
        print_error("kernel(...) failed: index [bold] out of range")
    assert captured.get().strip() == "error: kernel(...) failed: index [bold] out of range"


def test_without_a_searched_schedule_the_report_names_the_fastest_baseline(capsys):
    """A kernel with no schedule space (split-K with atomics): the table ranks the
    baselines among themselves and says which is fastest."""
    from types import SimpleNamespace

    from ws_tuner.candidate import Candidate, Lowering
    from ws_tuner.cli.tuning import _print_report
    from ws_tuner.pipeline import BASELINE, TrialRecord, TuneReport
    from ws_tuner.result import Status, Timing, TrialResult
    from ws_tuner.workload import Environment, WorkloadKey

    def record(params: dict, lowering: Lowering, ratio: float) -> TrialRecord:
        cand = Candidate.make(params, None, lowering)
        result = TrialResult(cand.hash, Status.OK, timing=Timing(ratio, ratio, ratio, 10), tflops=500 / ratio, ratio=ratio, confirmed=True)
        return TrialRecord(cand, result, BASELINE)

    report = TuneReport(WorkloadKey.make("k", "0" * 64, {"M": 1}, Environment("sm_90a", "NVIDIA H200", "0", "0", "0")), 0, compile_only=False)
    report.records += [record({"split_k": 2}, Lowering.DEFAULT, 1.0), record({"split_k": 2}, Lowering.ROLE_BASED, 0.99),
                       record({"vendor": "cublas"}, Lowering.REFERENCE, 0.9)]  # fmt: skip
    moved = 2e9  # bytes a call moves: 2,000 GB/s at 1 ms
    spec = SimpleNamespace(name="k", bytes_moved=lambda p: moved, gbps=lambda p, ms: moved / (ms * 1e-3) / 1e9)
    _print_report(report, SimpleNamespace(spec=spec, problem={"M": 1}, describe=Candidate.describe))
    out = " ".join(capsys.readouterr().out.split())
    assert "no schedule of the space was measured: the fastest kernel is reference ([reference] vendor=cublas)" in out
    assert "1.100x" in out  # default, against the fastest
    assert "GB/s" in out and "│ default │ 500 │ 2000 │ 1.0000 │" in out  # TFLOP/s, then GB/s, then the time


def test_a_memory_bound_kernel_reads_in_gb_per_s_where_its_file_says_what_it_moves(tmp_path, data_dir):
    """rmsnorm's few TFLOP/s say nothing of how close it runs to the memory's speed; its
    ``bytes_moved`` puts GB/s beside them in ``best`` and ``export``."""
    import json

    from ws_tuner import search
    from ws_tuner.kernel import load_kernel
    from ws_tuner.store import open_store
    from ws_tuner.task import Task
    from ws_tuner.testing import DUMMY_DEVICE, DummyRunner, VerifyOnlyBuilder
    from ws_tuner.tune import TuneOptions, Tuner

    spec, shape, ms = load_kernel(data_dir / "rmsnorm.py"), "M=1024,N=1024", 0.05
    task = Task.make(spec, spec.parse_problem(shape), spec.parse_params("blk_m=1,blk_k=512,num_stages=1,threads=128"))
    db = tmp_path / "r.db"
    Tuner(task, store=open_store(str(db)), builder=VerifyOnlyBuilder(), runner=DummyRunner(latency=lambda c: ms, flops=spec.flops(task.problem)),
          strategy=search.create("grid"), options=TuneOptions(budget=0)).run()  # fmt: skip
    gbps = 2.0 * (2 * 1024 * 1024 + 1024) / (ms * 1e-3) / 1e9  # x and y once each, the weight once: 83.9 GB/s
    proc = ws_tune("best", str(data_dir / "rmsnorm.py"), "--shape", shape, "--db", str(db), "--device", DUMMY_DEVICE)
    assert proc.returncode == 0, proc.stderr
    # Read from a machine without that GPU and driver: the device's results, saying how they were timed.
    assert proc.stderr.startswith(f"note: {DUMMY_DEVICE} was timed with tilelang") and "driver dummy (here: " in proc.stderr
    assert f"{gbps:.3g} GB/s, {ms:.4f} ms" in proc.stdout.splitlines()[0], proc.stdout
    out = tmp_path / "best.json"
    proc = ws_tune("export", str(data_dir / "rmsnorm.py"), "--shape", shape, "--db", str(db), "--device", DUMMY_DEVICE, "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(out.read_text())["results"][0]["gbps"] == pytest.approx(gbps)
    # A kernel file that does not say what it moves reads in TFLOP/s only.
    assert load_kernel(data_dir / "plain_gemm.py").gbps({"M": 1, "N": 1, "K": 1}, ms) is None


def test_a_value_error_from_inside_a_library_is_an_internal_error_not_bad_input(monkeypatch, capsys):
    """Optuna's "CategoricalDistribution does not support dynamic value space" read as bad
    input (exit 2), and WS_TUNE_DEBUG could not show where it came from."""
    import optuna

    from ws_tuner.cli.common import handles_errors
    from ws_tuner.shape import SpaceConfig

    @handles_errors
    def library():
        optuna.distributions.CategoricalDistribution([])

    @handles_errors
    def ours():
        SpaceConfig(producer_nreg=(7,))

    with pytest.raises(typer.Exit) as exit_library:
        library()
    with pytest.raises(typer.Exit) as exit_ours:
        ours()
    err = capsys.readouterr().err
    assert (exit_library.value.exit_code, exit_ours.value.exit_code) == (1, 2)
    assert "internal error: ValueError:" in err and "WS_TUNE_DEBUG=1" in err and "setmaxnreg budgets are 0, multiples of 8 in [24, 256], or -1" in err
    monkeypatch.setenv("WS_TUNE_DEBUG", "1")
    with pytest.raises(ValueError):
        library()


def test_a_pin_off_the_files_grid_is_tried_with_a_note(data_dir):
    """--param threads=384 where PARAMS lists 128 and 256: a value to try, or a typo; it is
    tried, and the user hears that it is not among the file's own."""
    proc = ws_tune("space", str(data_dir / "rmsnorm.py"), "--shape", "M=1024,N=1024", "--param", "threads=384,blk_m=1", "--sample", "2")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines()[0] == "note: --param threads=384 is not among rmsnorm's PARAMS (128, 256)"
    assert re.search(r"param\.threads\s*│\s*384\s*│", proc.stdout) and "blk_m=1" not in proc.stderr  # an on-grid pin says nothing


def test_what_candidates_vary_beyond_the_seed_is_not_called_kept():
    """A kernel that opts out of setmaxnreg: its candidates vary the budgets anyway, which a
    tuning's "kept as in the seed: register budgets" said the opposite of (a helper's port)."""
    from types import SimpleNamespace

    from ws_tuner.cli.common import err
    from ws_tuner.cli.tuning import _print_limits

    budgets = "register budgets: none in the seed, as the kernel asks (T.no_set_max_nreg); candidates vary them"
    sp = SimpleNamespace(limits=lambda: ["MMA overlap: the kernel's MMAs are synchronous"], widened=lambda: [budgets])
    for brief, expected in ((True, ["kept as in the seed: MMA overlap (`ws-tune space` says why)", "varied beyond the seed: register budgets (`ws-tune space` says why)"]),
                            (False, ["kept as in the seed: MMA overlap: the kernel's MMAs are synchronous", f"varied beyond the seed: {budgets}"])):  # fmt: skip
        with err.capture() as captured:
            _print_limits(sp, brief=brief)
        assert captured.get().splitlines() == expected


GEMM_INPUTS = "return [torch.randn(M, K, device=device, dtype=torch.float16), torch.randn(K, N, device=device, dtype=torch.float16), torch.empty(M, N, device=device, dtype=torch.float16)]"


@pytest.mark.parametrize(
    "inputs, needle",
    [
        (GEMM_INPUTS.replace("torch.randn(K, N, device=device, dtype=torch.float16), ", ""), "inputs() gives 2 arguments, the kernel takes 3 (A, B, C)"),
        (GEMM_INPUTS.replace("torch.randn(M, K, device=device, dtype=torch.float16)", "torch.randn(M, K, device=device)"), "inputs()[0] is float32 [256, 512], the kernel's A is float16 [256, 512]"),
        (GEMM_INPUTS.replace("torch.randn(K, N,", "torch.randn(N, K,"), "inputs()[1] is float16 [384, 512], the kernel's B is float16 [512, 384]"),
    ],
    ids=["count", "dtype", "shape"],
)
def test_inputs_that_do_not_fit_the_kernel_are_one_line_before_anything_is_built(tmp_path, inputs, needle):
    """A kernel file whose inputs() dropped an argument compiled and stored every candidate
    without a word (compile-only never launches; a GPU run fails each launch): inputs() is
    made on torch's meta device and held against the kernel's arguments first."""
    source = (ROOT / "tests" / "data" / "plain_gemm.py").read_text()
    assert GEMM_INPUTS in source
    path = tmp_path / "gemm.py"
    path.write_text(source.replace(GEMM_INPUTS, inputs))
    db = tmp_path / "r.db"
    proc = ws_tune(str(path), "--shape", "M=256,N=384,K=512", "--budget", "1", "--compile-only", "--db", str(db))
    assert_one_line_error(proc, f"gemm.py: {needle}")
    assert not db.exists()
    # inputs() that need real values (a length read back) are not checked here, and tune as before
    path.write_text(source.replace(GEMM_INPUTS, "assert device != 'meta'\n    " + GEMM_INPUTS))
    assert ws_tune("space", str(path), "--shape", "M=256,N=384,K=512").returncode == 0


def test_a_problem_whose_grid_cuda_cannot_launch_is_one_line(data_dir):
    """KDA's dA backward launches B * H blocks along y: at B = H = 1024 (the audit's size for
    any unlisted argument) that is over CUDA's 65535, yet it was built and called verified (a
    helper's port); on a GPU every launch would fail."""
    shape, pin = "B=1024,S=1024,H=1024", "block_DV=32,num_stages=0,threads=128"
    proc = ws_tune("space", str(data_dir / "kda_bwd_gla_da.py"), "--shape", shape, "--param", pin)
    assert_one_line_error(proc, "the kernel serves no kernel-parameter point at this problem (e.g. kernel: the grid cannot launch: blockIdx.y extent 1048576 is over CUDA's limit of 65535)")
    assert ws_tune("space", str(data_dir / "kda_bwd_gla_da.py"), "--shape", "B=1,S=1024,H=16", "--param", pin).returncode == 0


def test_a_kernel_tilelangs_parser_cannot_build_is_one_line_and_nothing_on_stdout(tmp_path):
    """T.Pipelined(group=...) of a newer tilelang: 0.1.15's parser logged the kernel's whole
    generated source (88 lines on stdout) before ws-tune's one line (a helper's port)."""
    loop = "T.Pipelined(T.ceildiv(K, block_K), num_stages=num_stages)"
    source = (ROOT / "tests" / "data" / "plain_gemm.py").read_text()
    assert loop in source
    path = tmp_path / "grouped.py"
    path.write_text(source.replace(loop, loop[:-1] + ", group=[1])"))
    proc = ws_tune("space", str(path), "--shape", "M=256,N=256,K=256")
    assert_one_line_error(proc, "grouped.kernel(block_K=64, block_M=128, block_N=128) failed: Pipelined() got an unexpected keyword argument 'group'")
    assert proc.stdout == ""
