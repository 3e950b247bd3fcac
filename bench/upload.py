"""Benchmark: a 2 GB artifact through the multipart upload path vs boto3's own ``upload_file``.

What it runs, all real, on free ports and a dedicated database:

1. An S3 server (``--s3``: LocalStack's S3 by default, or ``moto_server``), the web app (gunicorn,
   2 workers, as scripts/stack.sh starts it) and an orchestrator Celery worker (``-Q default
   --concurrency 2``, as scripts/stack.sh), against a PostgreSQL database ``modelyard_bench_upload``
   (dropped, created, migrated).
2. A model archive of ``--size`` bytes (default 2 GB): a plain .tar of a Triton model directory
   whose weights file is random bytes (``os.urandom`` in 8 MiB chunks), in a temporary directory
   that is deleted afterwards.
3. Baseline: boto3's ``upload_file`` of that file to the same endpoint, with a TransferConfig tuned
   like the CLI (``--part-size`` chunks, ``--parallel`` threads) and ``ChecksumAlgorithm: SHA256``
   (a SHA-256 per part, as the CLI's presigned ``PUT``s carry, and boto3's usual integrity
   setting). This is the run the ratio is taken against.
4. The product: ``modelyard register`` (the console script, a subprocess), timed from before it
   starts the upload to the moment it prints the version, i.e. client upload (whole-file SHA-256,
   each part's MD5 and SHA-256, parts sent) + the server's verification (part ETags, join,
   composite ETag and size, the tar's headers by ranged GETs, register the version). The
   background re-hash of the stored object that follows each registration is waited for (and
   timed) before the next run starts, so that it competes with no timed run.

   3 and 4 alternate ``--repeats`` times (3 by default), boto3 first each time, and the ratio is
   taken between the medians: how long the stand-in takes to join the same parts varies by a
   factor of two from one run to the next on a shared machine, and a single pair would measure
   that more than either client.
5. For reference, after them: boto3 without any per-part checksum (same part size and
   concurrency; moto, for one, then copies the whole object twice more at the join to compute a
   full-object checksum), and boto3's TransferConfig and checksum defaults (8 MiB parts, 10 threads, CRC32).
   Their ratios are reported, not judged.
6. Once, after those: ``modelyard register`` of a ``.zip`` of the same size (stored, not
   compressed), to show that the worker reads only its central directory and config (the ranged
   GETs and bytes it logs), as it does for the .tar.
7. Peak RSS of the web and worker processes (each process and each process tree: master plus
   children), polled every 50 ms with psutil while all runs happen.

The S3 server. ``--s3 localstack`` (the default; ``scripts/install_localstack.sh``) is LocalStack's
own S3: like AWS S3 and MinIO it checks each part's ``x-amz-checksum-sha256`` when the part arrives and
serves a ranged GET from the stored bytes. ``--s3 moto`` is moto's, which the tests use: it checks no
checksum, and a ranged GET of a 2 GB object costs about 1.4 s there (it reads the whole object into
memory to slice it; measured here), so the two ranged GETs the worker makes weigh on the product's
time on moto as they would not on a real store. Either way the same server serves both sides.

How long S3 took to join the parts (``CompleteMultipartUpload``) is recorded for every run: for
boto3 through botocore's event hooks, for the product from the worker's log. moto keeps objects in
temporary files; they are put in ``--s3-scratch`` (a tmpfs, ``/dev/shm``, by default) so that the
stand-in's own disk writes do not compete with the client and the worker, as a remote S3 would not.
The artifact is flushed to disk (``os.sync``) before the first run for the same reason.

The verdict (ratio ≥ ``--target-ratio`` and every web/worker process under ``--target-rss-mb``) is
written to the results; nothing here asserts it.

Usage::

    python bench/upload.py --json bench/results/upload.json --markdown bench/results/upload.md
"""

import argparse
import io
import json
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import boto3
import psutil
import requests
from boto3.s3.transfer import TransferConfig
from botocore.config import Config

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
DATABASE = "modelyard_bench_upload"
BUCKET = "modelyard-bench-upload"
MIB = 1024**2
BASELINE = "boto3 upload_file, same part size and concurrency, ChecksumAlgorithm SHA256 (like the CLI)"
BOTO3_PLAIN = "boto3 upload_file, same part size and concurrency, no per-part checksum"
BOTO3_DEFAULTS = "boto3 upload_file, TransferConfig and checksum defaults"
READ_BACK = re.compile(r"read back \d+ bytes in ([0-9.]+) s")
RANGED = re.compile(r"upload (\S+): parts checked by ETag; archive read by (\d+) ranged GETs \((\d+) bytes\)")
STAMP = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}")
CONFIG = b'name: "bench"\nbackend: "python"\nmax_batch_size: 8\n' \
         b'input [ { name: "input" data_type: TYPE_FP32 dims: [ 4 ] } ]\n' \
         b'output [ { name: "label" data_type: TYPE_INT64 dims: [ 1 ] } ]\n'
MODEL_SOURCE = b"class TritonPythonModel:\n    pass\n"  # the python backend's model file, which registration requires


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except Exception:  # still starting
            pass
        time.sleep(0.3)
    raise RuntimeError(f"timed out waiting for {what}")


class RandomReader:
    """A file-like object of ``size`` random bytes, for tarfile.addfile."""

    def __init__(self, size: int):
        self.left = size

    def read(self, n: int = -1) -> bytes:
        n = self.left if n < 0 else min(n, self.left)
        self.left -= n
        return os.urandom(n)


def write_zip(path: Path, size: int) -> Path:
    """A .zip (stored) of one Triton model directory, about ``size`` bytes in total."""
    import zipfile

    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as archive:
        archive.writestr("bench/config.pbtxt", CONFIG)
        archive.writestr("bench/1/model.py", MODEL_SOURCE)
        left = size - 10 * 1024
        with archive.open("bench/1/model.bin", "w", force_zip64=True) as member:
            while left > 0:
                chunk = min(8 * MIB, left)
                member.write(os.urandom(chunk))
                left -= chunk
    return path


def write_archive(path: Path, size: int) -> Path:
    """A plain .tar of one Triton model directory, ``size`` bytes in total (within a tar record)."""
    weights = size - 10 * 1024  # headers, the config, model.py and the end-of-archive record
    with tarfile.open(path, "w", bufsize=8 * MIB) as tar:
        for name, text in (("bench/config.pbtxt", CONFIG), ("bench/1/model.py", MODEL_SOURCE)):
            info = tarfile.TarInfo(name)
            info.size = len(text)
            tar.addfile(info, io.BytesIO(text))
        data = tarfile.TarInfo("bench/1/model.bin")
        data.size = weights
        tar.addfile(data, RandomReader(weights))
    return path


class MemoryWatch:
    """Polls the RSS of process trees (a master and its children) every ``interval`` seconds."""

    def __init__(self, roots: dict[str, int], interval: float = 0.05):
        self.roots, self.interval = roots, interval
        self.peak_tree = dict.fromkeys(roots, 0)
        self.peak_process: dict[str, int] = dict.fromkeys(roots, 0)
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for name, pid in self.roots.items():
                try:
                    root = psutil.Process(pid)
                    procs = [root, *root.children(recursive=True)]
                except psutil.NoSuchProcess:
                    continue
                sizes = []
                for proc in procs:
                    try:
                        sizes.append(proc.memory_info().rss)
                    except psutil.NoSuchProcess:
                        pass
                self.peak_tree[name] = max(self.peak_tree[name], sum(sizes))
                self.peak_process[name] = max(self.peak_process[name], max(sizes, default=0))
            self.samples += 1
            time.sleep(self.interval)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def start(name: str, args: list[str], env: dict, logs: Path) -> subprocess.Popen:
    log = (logs / f"{name}.log").open("wb")
    return subprocess.Popen(args, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)


def psql(sql: str) -> None:
    subprocess.run(["psql", "-h", "127.0.0.1", "-U", "postgres", "-q", "-c", sql], check=True,
                   capture_output=True)


def log_time(text: str, pattern: str) -> float | None:
    """The timestamp (epoch seconds) of the last log line matching ``pattern`` (logs are in local time)."""
    found = None
    for line in text.splitlines():
        stamp = STAMP.search(line)
        if stamp and re.search(pattern, line):
            found = datetime.strptime(stamp.group(0), "%Y-%m-%d %H:%M:%S,%f").timestamp()
    return found


LOCALSTACK = REPO / ".stack/bin/localstack-s3"
STORES = {
    "localstack": "LocalStack's S3 (checks each part's SHA-256 on arrival, serves ranged GETs from the stored bytes)",
    "moto": "moto_server, its temporary files on a tmpfs (checks no checksum; a ranged GET reads the whole object)",
}


def localstack_ready(url: str) -> bool:
    """Whether LocalStack at ``url`` reports its S3 service up."""
    try:
        return requests.get(f"{url}/_localstack/health", timeout=2).json()["services"]["s3"] in ("available",
                                                                                                 "running")
    except (requests.RequestException, ValueError, KeyError):
        return False


def store_gets(store: str, s3_log: str, web_log: str, offset: int) -> dict[str, int]:
    """GETs of the upload's object the S3 server logged since ``offset`` (a position in its log), by HTTP
    status: 206 for ranged GETs, 200 for whole ones. moto logs the key (``GET …?uploadId=`` is ListParts, not a
    read); LocalStack logs the operation only, and the bench's one object is the only one read meanwhile."""
    if store == "localstack":
        statuses = re.findall(r"AWS s3\.GetObject => (\d{3})", s3_log[offset:])
    else:
        upload_id = re.findall(r"upload (\S+) of bench complete by", web_log)[-1]
        whole_reads = rf'"(?:\x1b\[[0-9;]*m)*GET /{BUCKET}/uploads/{upload_id} HTTP[^"]*" (\d{{3}})'
        statuses = re.findall(whole_reads, s3_log[offset:])
    return {code: statuses.count(code) for code in sorted(set(statuses))}


def run(args) -> dict:
    work = Path(tempfile.mkdtemp(prefix="bench-upload-", dir=args.tmp))
    logs = work / "logs"
    logs.mkdir()
    s3_port, web_port = free_port(), free_port()
    s3_url, web_url = f"http://127.0.0.1:{s3_port}", f"http://127.0.0.1:{web_port}"
    env = {**os.environ, "DATABASE_URL": f"postgres://postgres@127.0.0.1:5432/{DATABASE}",
           "CELERY_BROKER_URL": args.broker, "MODELYARD_S3_ENDPOINT_URL": s3_url, "MODELYARD_S3_BUCKET": BUCKET,
           "MODELYARD_DEBUG": "true", "MODELYARD_LOG_LEVEL": "INFO", "DJANGO_SETTINGS_MODULE": "modelyard.settings"}
    processes: list[subprocess.Popen] = []
    scratch_dirs: list[Path] = []
    result: dict = {"started": datetime.now(UTC).isoformat(timespec="seconds"), "size_bytes": args.size,
                    "part_size_bytes": args.part_size, "parallel": args.parallel}
    try:
        psql(f"DROP DATABASE IF EXISTS {DATABASE}")
        psql(f"CREATE DATABASE {DATABASE}")
        subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=REPO, env=env, check=True)
        import redis

        redis.Redis.from_url(args.broker).flushdb()
        token = subprocess.run(
            [sys.executable, "manage.py", "shell", "-c",
             "from django.contrib.auth import get_user_model; from accounts.tokens import issue_token;"
             "from accounts.choices import Role; from accounts.services import default_team, set_membership;"
             "from registry.models import RegisteredModel; RegisteredModel.objects.create(name='bench');"
             "user = get_user_model().objects.create_user('bench');"
             # an owner of the model's team, as a user of the product would be
             "set_membership(team=default_team(), user=user, role=Role.OWNER);"
             "print(issue_token(user=user, name='bench', scopes=['read', 'write'])[1])"],
            cwd=REPO, env=env, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
        result["s3"] = args.s3
        if args.s3 == "localstack":
            # its objects in --s3-scratch (a tmpfs), as moto's are
            s3_dir = Path(tempfile.mkdtemp(prefix="bench-localstack-", dir=args.s3_scratch))
            scratch_dirs.append(s3_dir)
            processes.append(start("s3", [str(LOCALSTACK), f"127.0.0.1:{s3_port}", str(s3_dir)], env, logs))
            wait_until(lambda: localstack_ready(s3_url), 120, "LocalStack's S3")
        else:
            processes.append(start("s3", [str(BIN / "moto_server"), "-H", "127.0.0.1", "-p", str(s3_port)],
                                   {**env, "TMPDIR": args.s3_scratch}, logs))
            wait_until(lambda: requests.get(s3_url, timeout=2).ok, 60, "moto_server")
        s3, s3_plain = (
            boto3.client("s3", endpoint_url=s3_url, region_name="us-east-1", aws_access_key_id="bench",
                         aws_secret_access_key="bench",
                         config=Config(s3={"addressing_style": "path"}, signature_version="s3v4", **checksums))
            for checksums in ({}, {"request_checksum_calculation": "when_required",
                                   "response_checksum_validation": "when_required"})
        )
        s3.create_bucket(Bucket=BUCKET)
        web = start("web", [str(BIN / "gunicorn"), "modelyard.wsgi", "-b", f"127.0.0.1:{web_port}", "--workers", "2",
                            "--timeout", "300", "--access-logfile", "-", "--error-logfile", "-"], env, logs)
        worker = start("worker", [str(BIN / "celery"), "-A", "modelyard", "worker", "-Q", "default", "-n",
                                  f"bench-{web_port}@%h", "--concurrency", "2", "--loglevel", "INFO",
                                  "--without-gossip", "--without-mingle"], env, logs)
        processes += [web, worker]
        wait_until(lambda: requests.get(f"{web_url}/healthz", timeout=2).ok, 90, "gunicorn")
        wait_until(lambda: " ready." in (logs / "worker.log").read_text(errors="replace"), 90, "the worker")

        archive = work / "bench.tar"
        started = time.monotonic()
        write_archive(archive, args.size)
        result["archive_bytes"] = archive.stat().st_size
        result["archive_write_s"] = round(time.monotonic() - started, 1)
        os.sync()
        result["load_before"] = os.getloadavg()[0]

        tuned = TransferConfig(multipart_threshold=args.part_size, multipart_chunksize=args.part_size,
                               max_concurrency=args.parallel)
        cli_env = {**env, "MODELYARD_URL": web_url, "MODELYARD_TOKEN": token}

        def boto3_run(client, config: TransferConfig, extra: dict | None = None) -> tuple[float, float | None]:
            """boto3's upload_file of the archive: (seconds, of which CompleteMultipartUpload)."""
            marks: dict[str, float] = {}
            handlers = [(f"{when}-call.s3.CompleteMultipartUpload",
                         lambda mark=when, **_: marks.__setitem__(mark, time.monotonic()))
                        for when in ("before", "after")]
            for event, handler in handlers:
                client.meta.events.register(event, handler)
            began = time.monotonic()
            client.upload_file(str(archive), BUCKET, "bench/baseline", Config=config, ExtraArgs=extra)
            seconds = time.monotonic() - began
            for event, handler in handlers:
                client.meta.events.unregister(event, handler)
            client.delete_object(Bucket=BUCKET, Key="bench/baseline")
            return seconds, (marks["after"] - marks["before"] if len(marks) == 2 else None)

        def version_verified(number: int) -> bool:
            answer = requests.get(f"{web_url}/api/v1/models/bench/versions/{number}/",
                                  headers={"Authorization": f"Bearer {token}"}, timeout=10).json()
            if answer["status"] != "ready":
                raise RuntimeError(f"bench v{number} is {answer['status']}: {answer.get('integrity_error')}")
            return answer["sha256_verified_at"] is not None

        def cli_run(number: int, path: Path) -> dict:
            """``modelyard register`` of ``path`` as version ``number``: its times, from the clock and the logs."""
            seen_before = {pattern: len(re.findall(pattern, (logs / "worker.log").read_text(errors="replace")))
                           for pattern in (RANGED, READ_BACK)}
            s3_log_before = len((logs / "s3.log").read_text(errors="replace"))
            began, began_wall = time.monotonic(), time.time()
            cli = subprocess.run([str(BIN / "modelyard"), "register", "bench", str(path), "--quiet",
                                  "--part-size", str(args.part_size), "--parallel", str(args.parallel)],
                                 env=cli_env, capture_output=True, text=True, timeout=3600)
            seconds = time.monotonic() - began
            if cli.returncode != 0:
                raise RuntimeError(f"modelyard register failed: {cli.stderr[-2000:]}")
            web_log, worker_log = ((logs / f"{name}.log").read_text(errors="replace") for name in ("web", "worker"))
            completed_at = log_time(web_log, r"complete by .*; verifying")
            registered_at = log_time(worker_log, rf"registered bench v{number}\b")
            run = {"ours_s": seconds, "cli_output": json.loads(cli.stdout),
                   "ours_join_s": float(re.findall(r"S3 joined the parts in ([0-9.]+) s", worker_log)[-1])}
            read_back = re.findall(READ_BACK, worker_log)[seen_before[READ_BACK]:]
            ranged = re.findall(RANGED, worker_log)[seen_before[RANGED]:]
            run["read_back_s"] = float(read_back[-1]) if read_back else 0.0
            if ranged:
                run["ranged_gets"], run["ranged_bytes"] = int(ranged[-1][1]), int(ranged[-1][2])
            if completed_at and registered_at:
                run["client_upload_s"] = completed_at - began_wall
                run["server_verification_s"] = registered_at - completed_at
            # The background re-hash runs now; wait for it so that it competes with no timed run.
            wait_until(lambda: version_verified(number), 600, f"the re-hash of bench v{number}")
            # What the S3 stand-in itself served of the object, by HTTP status: 206 for the ranged GETs
            # before READY, 200 for the background re-hash's one whole GET.
            run["store_gets_of_object"] = store_gets(args.s3, (logs / "s3.log").read_text(errors="replace"),
                                                     web_log, s3_log_before)
            rehashed = re.findall(r"re-hashed \d+ bytes in ([0-9.]+) s", (logs / "worker.log").read_text(
                errors="replace"))
            run["rehash_s"] = float(rehashed[-1]) if rehashed else None
            # the version's artifact is the upload's object; drop it so the stand-in holds one at a time
            for item in s3.list_objects_v2(Bucket=BUCKET, Prefix="uploads/").get("Contents", []):
                s3.delete_object(Bucket=BUCKET, Key=item["Key"])
            return run

        sha256_parts = {"ChecksumAlgorithm": "SHA256"}
        runs, references = [], {}
        with MemoryWatch({"web": web.pid, "worker": worker.pid}) as memory:
            for number in range(1, args.repeats + 1):
                boto3_s, boto3_join_s = boto3_run(s3, tuned, sha256_parts)
                runs.append({"boto3_s": boto3_s, "boto3_join_s": boto3_join_s, **cli_run(number, archive)})
            for label, client, config in ((BOTO3_PLAIN, s3_plain, tuned), (BOTO3_DEFAULTS, s3, TransferConfig())):
                references[label] = boto3_run(client, config)
            if not args.skip_zip:
                archive.unlink()
                zipped = write_zip(work / "bench.zip", args.size)
                os.sync()
                result["zip_run"] = {k: (round(v, 2) if isinstance(v, float) else v)
                                     for k, v in cli_run(args.repeats + 1, zipped).items()}
                result["zip_run"]["archive_bytes"] = zipped.stat().st_size
                zipped.unlink()
        result["runs"] = [{k: (round(v, 2) if isinstance(v, float) else v) for k, v in run.items()} for run in runs]
        median = lambda key: round(statistics.median(run[key] for run in runs), 2)  # noqa: E731
        result["cli_output"] = runs[-1]["cli_output"]
        result["baselines_s"] = {BASELINE: median("boto3_s"), **{k: round(v[0], 2) for k, v in references.items()}}
        result["joins_s"] = {BASELINE: median("boto3_join_s"), "`modelyard register`": median("ours_join_s"),
                             **{k: round(v[1], 2) for k, v in references.items() if v[1] is not None}}
        result["ours_s"] = median("ours_s")
        result["server_read_back_s"] = median("read_back_s")
        if all("ranged_gets" in run for run in runs):
            result["ranged_gets"] = max(run["ranged_gets"] for run in runs)
            result["ranged_bytes"] = max(run["ranged_bytes"] for run in runs)
        result["rehash_s"] = median("rehash_s") if all(run.get("rehash_s") for run in runs) else None
        if all("client_upload_s" in run for run in runs):
            result["client_upload_s"] = median("client_upload_s")
            result["server_verification_s"] = median("server_verification_s")
        result["peak_rss_bytes"] = {"tree": memory.peak_tree, "largest_process": memory.peak_process}
        result["rss_samples"] = memory.samples
        result["load_after"] = os.getloadavg()[0]
        archive.unlink(missing_ok=True)
    finally:
        for process in reversed(processes):
            stop(process)
        shutil.rmtree(work, ignore_errors=True)
        for directory in scratch_dirs:
            shutil.rmtree(directory, ignore_errors=True)
        if not args.keep:
            psql(f"DROP DATABASE IF EXISTS {DATABASE}")
    baseline = result["baselines_s"][BASELINE]
    result["throughput_mb_s"] = {"baseline": round(args.size / baseline / 1e6, 1),
                                 "ours": round(args.size / result["ours_s"] / 1e6, 1)}
    result["ratio"] = round(baseline / result["ours_s"], 3)
    result["reference_ratios"] = {label: round(seconds / result["ours_s"], 3)
                                  for label, seconds in result["baselines_s"].items() if label != BASELINE}
    largest = max(result["peak_rss_bytes"]["largest_process"].values())
    ok_ratio, ok_rss = result["ratio"] >= args.target_ratio, largest < args.target_rss_mb * MIB
    result["verdict"] = "pass" if ok_ratio and ok_rss else "fail"
    result["verdict_reason"] = (
        f"throughput ratio {result['ratio']:.2f} (target ≥ {args.target_ratio}); largest web/worker process "
        f"{largest / MIB:.0f} MB (target < {args.target_rss_mb} MB)"
    )
    return result


def markdown(r: dict, args) -> str:
    mb = lambda n: f"{n / MIB:.0f}"  # noqa: E731
    lines = [
        "# Multipart upload of a large artifact", "",
        f"Run {r['started']} on {platform.node()}, {os.cpu_count()} CPUs, Python {platform.python_version()}.", "",
        f"**Verdict: {r['verdict'].upper()}** — {r['verdict_reason']}", "",
        "## Setup", "",
        f"- Artifact: a plain .tar of a Triton model directory, {r['archive_bytes']} bytes (random weights), "
        f"written in {r['archive_write_s']} s.",
        f"- One S3 server for all runs: {STORES[r.get('s3', 'moto')]}; gunicorn with 2 workers "
        "and one Celery worker (`-Q default --concurrency 2`), as scripts/stack.sh starts them; PostgreSQL.",
        f"- Part size {r['part_size_bytes']} bytes, {r['parallel']} parts in flight, for the CLI and the tuned "
        "boto3 runs alike. The ratio is taken against the first row: boto3 sending each part with its "
        "SHA-256 (`ChecksumAlgorithm: SHA256`), as the CLI's presigned PUTs carry it. It and ours alternate "
        f"{len(r['runs'])} times, boto3 first; both rows are medians. The reference rows run once, after them. "
        "The server's background re-hash of each new version is waited for between runs and timed apart.", "",
        "## Results", "",
        "| path | seconds | MB/s | of which S3 joining the parts (s) |", "|---|---|---|---|",
    ]
    joins = r.get("joins_s", {})
    rows = [(BASELINE, r["baselines_s"][BASELINE]), ("`modelyard register` (create → completed)", r["ours_s"]),
            *((k, v) for k, v in r["baselines_s"].items() if k != BASELINE)]
    for label, seconds in rows:
        join = joins.get("`modelyard register`" if label.startswith("`modelyard") else label, "")
        lines.append(f"| {label} | {seconds} | {r['size_bytes'] / seconds / 1e6:.1f} | {join} |")
    lines += ["", f"- Ratio (first row's time / ours): **{r['ratio']}**."]
    lines += [f"- Reference, not judged: {label} / ours = {ratio}." for label, ratio in r["reference_ratios"].items()]
    lines += ["", "| pair | boto3 (s) | of which join | ours (s) | of which join | of which read-back | "
              "ranged GETs (bytes), worker's count | GETs of the object, S3 server's log | re-hash after (s) |",
              "|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {i} | {run['boto3_s']} | {run['boto3_join_s']} | {run['ours_s']} | {run['ours_join_s']} | "
              f"{run['read_back_s']} | {run.get('ranged_gets', '—')} ({run.get('ranged_bytes', '—')}) | "
              f"{run.get('store_gets_of_object', '—')} | {run.get('rehash_s')} |"
              for i, run in enumerate(r["runs"], start=1)]
    lines.append("")
    if "client_upload_s" in r:
        lines.append(f"- Of ours (medians): client upload (hashes + parts) {r['client_upload_s']} s, server "
                     f"verification (part ETags, join, composite ETag, structure, register) "
                     f"{r['server_verification_s']} s, of which a stream back {r.get('server_read_back_s', '?')} s.")
    if r.get("ranged_gets") is not None:
        lines.append(f"- The worker read the {r['archive_bytes']}-byte .tar's structure with at most "
                     f"{r['ranged_gets']} ranged GETs ({r['ranged_bytes']} bytes); its background re-hash of the "
                     f"stored object took {r.get('rehash_s')} s (median), after the version was READY.")
    if "zip_run" in r:
        z = r["zip_run"]
        lines.append(f"- A {z['archive_bytes']}-byte .zip (stored) became READY in {z['ours_s']} s; the worker read "
                     f"its central directory and config with {z.get('ranged_gets', '?')} ranged GETs "
                     f"({z.get('ranged_bytes', '?')} bytes) and read nothing back ({z['read_back_s']} s); the S3 "
                     "server's log shows these GETs of the object, by HTTP status: "
                     f"{z.get('store_gets_of_object', '?')} "
                     "(206: ranged; 200: whole, the background re-hash).")
    lines += [
        f"- Peak RSS, largest single process: web {mb(r['peak_rss_bytes']['largest_process']['web'])} MB, "
        f"worker {mb(r['peak_rss_bytes']['largest_process']['worker'])} MB.",
        f"- Peak RSS, whole tree (master + children): web {mb(r['peak_rss_bytes']['tree']['web'])} MB, "
        f"worker {mb(r['peak_rss_bytes']['tree']['worker'])} MB ({r['rss_samples']} samples at 50 ms).",
        f"- 1-minute load average {r['load_before']:.2f} before, {r['load_after']:.2f} after "
        "(the machine is shared).", "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", type=Path, default=REPO / "bench/results/upload.json")
    parser.add_argument("--markdown", type=Path, default=REPO / "bench/results/upload.md")
    parser.add_argument("--size", type=int, default=2_000_000_000, help="artifact bytes (default 2 GB)")
    parser.add_argument("--part-size", type=int, default=64 * MIB)
    parser.add_argument("--parallel", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3,
                        help="boto3 / CLI pairs, alternating; the ratio is taken between their medians")
    parser.add_argument("--broker", default=os.environ.get("MODELYARD_BENCH_BROKER_URL", "redis://127.0.0.1:6379/12"))
    parser.add_argument("--tmp", default=tempfile.gettempdir(), help="where the artifact is written")
    parser.add_argument("--s3-scratch", default="/dev/shm" if os.access("/dev/shm", os.W_OK) else tempfile.gettempdir(),
                        help="where the S3 stand-in keeps its temporary files (default: /dev/shm, a tmpfs)")
    parser.add_argument("--s3", choices=sorted(STORES), default="localstack",
                        help="the S3 server both sides upload to (default: localstack; see the module docstring)")
    parser.add_argument("--target-ratio", type=float, default=0.9)
    parser.add_argument("--target-rss-mb", type=float, default=200)
    parser.add_argument("--keep", action="store_true", help="keep the database")
    parser.add_argument("--skip-zip", action="store_true", help="skip the .zip run after the timed ones")
    args = parser.parse_args(argv)
    for where, need in ((args.tmp, 3 * args.size), (args.s3_scratch, 2 * args.size)):
        free = shutil.disk_usage(where).free
        if free < need:
            print(f"bench/upload.py: {where} has {free} bytes free; need {need}", file=sys.stderr)
            return 1
    if args.s3 == "localstack" and not LOCALSTACK.exists():
        print(f"bench/upload.py: {LOCALSTACK} is missing; run scripts/install_localstack.sh", file=sys.stderr)
        return 1
    result = run(args)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    args.markdown.write_text(markdown(result, args))
    print(result["verdict_reason"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
