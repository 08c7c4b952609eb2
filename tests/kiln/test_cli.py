"""The `kiln` command line as a user types it: its version, and a mistyped flag named as such."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kiln.cli import main


def test_version_is_the_installed_package_version(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    # The installed distribution's version, read independently of the CLI (pip's own metadata).
    shown = subprocess.run([sys.executable, "-m", "pip", "show", "kiln-pretrain"], capture_output=True, text=True,
                           check=True).stdout
    expected = next(line.split(":", 1)[1].strip() for line in shown.splitlines() if line.startswith("Version:"))
    assert capsys.readouterr().out.strip() == f"kiln {expected}"


@pytest.mark.parametrize("argv, message", [
    # required one-of group: argparse alone reports "one of the arguments --text --doc-id is required"
    (["audit", "membership", "--doc_id", "x"], "unrecognized argument --doc_id: did you mean --doc-id?"),
    (["forget", "--sorce", "web"], "unrecognized argument --sorce: did you mean --source?"),
    (["plan", "--budget_usd=5"], "unrecognized argument --budget_usd: did you mean --budget-usd?"),
    (["audit", "lineage", "checkpoint", "--frobnicate"], "unrecognized argument --frobnicate"),
    (["plan", "--version"], "unrecognized argument --version\n"),  # not "did you mean --json?" (a ratio of 0.67)
    # before the command: argparse alone says "the following arguments are required: COMMAND"
    (["--verison"], "kiln: error: unrecognized argument --verison: did you mean --version?"),
    # a question's flag before the question: argparse alone says "kiln: error: unrecognized arguments: --json"
    (["audit", "--json", "lineage", "checkpoint"], "kiln audit: error: --json goes after the question: kiln audit "
                                                   "lineage ... --json\n"),
    (["audit", "--doc-id", "x", "membership"], "kiln audit: error: --doc-id goes after the question: kiln audit "
                                               "membership ... --doc-id (membership takes it)"),
    (["dedup", "--redis", "env", "migrate-index"], "kiln dedup: error: --redis goes after the action: kiln dedup "
                                                   "migrate-index ... --redis"),
])
def test_a_mistyped_flag_is_named_with_a_suggestion(argv, message, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_abbreviated_and_exact_flags_still_parse():
    from kiln.cli import build_parser

    args = build_parser().parse_args(["audit", "membership", "--doc", "abc", "--json"])  # --doc: --doc-id
    assert args.doc_id == "abc" and args.json
    args = build_parser().parse_args(["forget", "--source=web", "--reason", "--ticket 12"])  # a value, not a flag
    assert args.source == "web"


def test_a_reader_that_leaves_early_gets_no_traceback():
    """`kiln plan | head -1`: once the reader has gone, the next write fails (EPIPE); the command ends quietly."""
    kiln = str(Path(sys.executable).with_name("kiln"))  # the installed command
    proc = subprocess.Popen([kiln, "plan", "--budget-usd", "1000000", "--gpu", "H100"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader is gone before the first line is written
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 1 and "Traceback" not in err and "BrokenPipeError" not in err, err


@pytest.mark.parametrize("argv, unreadable, message", [
    (["audit", "refreshes"], "kiln.yaml", "kiln audit: {dir}/kiln.yaml: cannot read the config file (Permission "
                                          "denied); give this user read access to it, or point KILN_CONFIG or "
                                          "--config at a readable copy"),
    (["audit", "membership", "--text", "{dir}/doc.txt"], "doc.txt",
     "kiln audit: --text: cannot read '{dir}/doc.txt' (Permission denied)"),
    (["forget", "--doc-ids", "{dir}/ids.txt"], "ids.txt", "kiln forget: --doc-ids: cannot read '{dir}/ids.txt' "
                                                          "(Permission denied)"),
])
def test_a_file_the_user_may_not_read_is_named_not_a_traceback(argv, unreadable, message, tmp_path, monkeypatch,
                                                              capsys):
    """A config, --text or --doc-ids file without read permission (simulated: tests may run as root, who reads
    anything) ended the command in a PermissionError traceback."""
    (tmp_path / "data").mkdir()
    config = {"sources": [{"name": "web", "kind": "jsonl", "path": str(tmp_path / "*.jsonl"), "license": "MIT",
                           "domain": "web", "profile": "none"}], "profiles": {"none": []}}
    (tmp_path / "kiln.yaml").write_text(json.dumps(config))
    for name in ("doc.txt", "ids.txt"):
        (tmp_path / name).write_text("some text\n")
    monkeypatch.setenv("KILN_HOME", str(tmp_path))
    monkeypatch.setenv("KILN_CONFIG", str(tmp_path / "kiln.yaml"))
    read_text = Path.read_text

    def denied(path, *args, **kwargs):
        if path.name == unreadable:
            raise PermissionError(13, "Permission denied", str(path))
        return read_text(path, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", denied)
    assert main([a.format(dir=tmp_path) for a in argv]) == 2
    assert capsys.readouterr().err.strip() == message.format(dir=tmp_path)


def test_an_aws_profile_that_does_not_exist_is_named_not_a_traceback(tmp_path, monkeypatch, capsys):
    """storage.backend: s3 with a misspelt AWS_PROFILE: boto3 fails making the client, before any request (which
    S3Remote.connect reports), and the command ended in a ProfileNotFound traceback."""
    config = {"sources": [{"name": "web", "kind": "jsonl", "path": str(tmp_path / "*.jsonl"), "license": "MIT",
                           "domain": "web", "profile": "none"}], "profiles": {"none": []},
              "storage": {"backend": "s3", "bucket": "kiln-test"}}
    (tmp_path / "kiln.yaml").write_text(json.dumps(config))
    (tmp_path / "aws-config").write_text("[default]\nregion = us-east-1\n")
    monkeypatch.setenv("KILN_HOME", str(tmp_path))
    monkeypatch.setenv("KILN_CONFIG", str(tmp_path / "kiln.yaml"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "aws-config"))
    monkeypatch.setenv("AWS_PROFILE", "kiln-no-such-profile")
    assert main(["audit", "refreshes"]) == 2
    assert capsys.readouterr().err.strip() == (
        "kiln audit: storage: cannot set up the S3 client for bucket 'kiln-test' (The config profile "
        "(kiln-no-such-profile) could not be found); check AWS_PROFILE and the other AWS_* variables, or ~/.aws/config")


def test_migrating_a_redis_index_without_the_redis_client_says_what_to_install(tmp_path, monkeypatch, capsys):
    """The Redis client comes with the production extra; without it, `kiln dedup migrate-index --redis URL` ended in a
    ModuleNotFoundError traceback."""
    (tmp_path / "data").mkdir()
    config = {"sources": [{"name": "web", "kind": "jsonl", "path": str(tmp_path / "*.jsonl"), "license": "MIT",
                           "domain": "web", "profile": "none"}], "profiles": {"none": []}}
    (tmp_path / "kiln.yaml").write_text(json.dumps(config))
    monkeypatch.setenv("KILN_HOME", str(tmp_path))
    monkeypatch.setenv("KILN_CONFIG", str(tmp_path / "kiln.yaml"))
    monkeypatch.setitem(sys.modules, "redis", None)  # `import redis` raises ModuleNotFoundError, as when not installed
    assert main(["dedup", "migrate-index", "--redis", "redis://127.0.0.1:6379/0"]) == 2
    assert capsys.readouterr().err == (
        "kiln dedup migrate-index: --redis: the Redis client is not installed; install it with Kiln's production extra "
        "(pip install 'kiln-pretrain[production]', or pip install 'redis>=5')\n")
