"""Command lines are stored truncated and with obvious secrets hidden."""
from __future__ import annotations

import pytest

from slotscope.agent.identity import CMDLINE_MAX, REDACTED, format_cmdline, redact_argv

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("argv,want", [
    (["train.py", "--password", "hunter2", "--lr", "0.1"], ["train.py", "--password", REDACTED, "--lr", "0.1"]),
    (["--api-key=abc123"], [f"--api-key={REDACTED}"]),
    (["--api_key", "abc123", "--epochs", "3"], ["--api_key", REDACTED, "--epochs", "3"]),
    (["--aws-secret-access-key", "wJalrXUtnFEMI"], ["--aws-secret-access-key", REDACTED]),
    (["TOKEN=abc"], [f"TOKEN={REDACTED}"]),
    (["env", "HF_TOKEN=hf_abcdefghijklmnopqrstuv", "python"], ["env", f"HF_TOKEN={REDACTED}", "python"]),
    (["db.password=x"], [f"db.password={REDACTED}"]),
    (["git", "clone", "https://user:pa55w0rd@github.com/org/repo.git"],
     ["git", "clone", f"https://{REDACTED}@github.com/org/repo.git"]),
    (["--db", "postgres://admin:s3cret@db.internal:5432/runs"], ["--db", f"postgres://{REDACTED}@db.internal:5432/runs"]),
    (["curl", "-H", "Authorization: Bearer abc.def-ghi_jkl", "https://x/"],
     ["curl", "-H", f"Authorization: Bearer {REDACTED}", "https://x/"]),
    (["aws", "--key", "AKIAIOSFODNN7EXAMPLE"], ["aws", "--key", REDACTED]),
    (["--model", "hf_abcdefghijklmnopqrstuvwxyz"], ["--model", REDACTED]),
    (["--gh", "ghp_abcdefghijklmnopqrstuvwxyz0123"], ["--gh", REDACTED]),
    (["--openai", "sk-abcdefghijklmnopqrstuvwxyz"], ["--openai", REDACTED]),
])
def test_secrets_are_hidden(argv, want):
    got = redact_argv(argv)
    assert got == want
    # and the secret text is gone from the joined command line too
    joined = format_cmdline("\0".join(argv).encode() + b"\0")
    for secret in ("hunter2", "abc123", "wJalr", "pa55w0rd", "s3cret", "abc.def", "AKIAIOSFODNN7EXAMPLE",
                   "hf_abcdefghij", "ghp_abcdef", "sk-abcdef"):
        assert secret not in joined


def test_flag_at_the_end_hides_nothing_else():
    assert redact_argv(["train.py", "--password"]) == ["train.py", "--password"]


def test_ordinary_args_untouched():
    argv = ["torchrun", "--nproc_per_node=8", "--nnodes", "2", "train.py", "--save_dir", "/mnt/ckpt/run-7",
            "--checkpoint-every", "100", "--lr=3e-4", "--resume", "https://example.org/ckpt/step100.pt",
            "NCCL_DEBUG=INFO", "user@host:/data", "--batch-size", "32", "-p", "x"]
    assert redact_argv(argv) == argv


def test_ml_flags_that_only_contain_a_secret_word_are_ordinary():
    """--tokenizer gpt2, --max-tokens 2048, --num-passes 3 are not secrets (over-redaction hides
    what the command was doing and loses nothing secret)."""
    argv = ["python", "train.py", "--tokenizer", "gpt2", "--max-tokens", "2048", "--num-passes", "3",
            "--author", "alice", "MAX_TOKENS=4096"]
    assert redact_argv(argv) == argv


def test_format_cmdline_joins_argv_and_redacts():
    raw = b"python\0train.py\0--hf-token\0hf_abcdefghijklmnopqrstuv\0--out\0/mnt/ckpt\0"
    assert format_cmdline(raw) == f"python train.py --hf-token {REDACTED} --out /mnt/ckpt"


def test_format_cmdline_of_empty_and_non_utf8():
    assert format_cmdline(b"") == ""
    assert format_cmdline(b"caf\xe9\0x\0") == "caf\ufffd x"


def test_long_command_lines_are_truncated():
    raw = b"\0".join([b"python", b"train.py"] + [f"--opt{i}=value{i}".encode() for i in range(200)]) + b"\0"
    text = format_cmdline(raw)
    assert len(text) == CMDLINE_MAX
    assert text.endswith("...")
    assert text.startswith("python train.py --opt0=value0 ")


def test_short_command_lines_are_not_truncated():
    raw = b"a" * (CMDLINE_MAX - 2) + b"\0b\0"      # exactly CMDLINE_MAX characters once joined
    text = format_cmdline(raw)
    assert len(text) == CMDLINE_MAX
    assert not text.endswith("...")


def test_secret_beyond_the_cut_is_still_not_kept():
    raw = b"\0".join([b"x" * (CMDLINE_MAX - 20), b"--password", b"hunter2hunter2hunter2"]) + b"\0"
    assert "hunter2" not in format_cmdline(raw)


@pytest.mark.parametrize("arg,secrets,kept", [
    ("train.sh --password hunter2 token=abcd; export AWS_SECRET_ACCESS_KEY=wJalrXUtn && run",
     ("hunter2", "abcd", "wJalrXUtn"), ("train.sh", "--password", "token=", "export", "AWS_SECRET_ACCESS_KEY=", "run")),
    ("python save.py --api-key 'two words' --out /mnt/ckpt", ("two words",), ("--api-key", "--out /mnt/ckpt")),
    ('curl -u alice:hunter2 -d \'{"password": "x1y2", "n": 3}\' https://x/', ("hunter2", "x1y2"),
     ("alice:", '"n": 3', "https://x/")),
    ("mysql -phunter2 -h db", ("hunter2",), ("mysql", "-h db")),
    ("login --pw s3cr3t --key k3y9 password:p4ss", ("s3cr3t", "k3y9", "p4ss"), ("login", "--pw", "--key", "password:")),
])
def test_secrets_inside_a_shell_string_are_hidden(arg, secrets, kept):
    """`sh -c '...'` gives the whole script as one argument: its words are redacted as argv's are."""
    text = format_cmdline(b"\0".join([b"sh", b"-c", arg.encode()]) + b"\0")
    for secret in secrets:
        assert secret not in text, text
    for part in kept:
        assert part in text, text


@pytest.mark.parametrize("argv,want", [
    (["mysql", "-phunter2"], ["mysql", f"-p{REDACTED}"]),
    (["tool", "--pw", "x"], ["tool", "--pw", REDACTED]),
    (["tool", "--key", "x"], ["tool", "--key", REDACTED]),
    (["tool", "password:x"], ["tool", f"password:{REDACTED}"]),
    (["tool", '{"password":"x"}'], ["tool", f'{{"password":"{REDACTED}"}}']),
    (["curl", "-u", "user:hunter2", "https://x/"], ["curl", "-u", f"user:{REDACTED}", "https://x/"]),
    (["tool", "--monkey", "3", "--keyboard", "us"], ["tool", "--monkey", "3", "--keyboard", "us"]),
])
def test_one_argument_forms(argv, want):
    assert redact_argv(argv) == want
