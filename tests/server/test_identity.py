"""Named API keys and the door-neutral identity: the key file, its re-reading, and who a caller is."""

from __future__ import annotations

import datetime as dt
import logging
import stat
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ragserve.api_keys import KeyFile, add_key, digest_of, parse_keys, read_keys, revoke_keys
from ragserve.cli import app as cli
from ragserve.config import AccessSettings
from ragserve.errors import ConfigError, PermissionDenied, Unauthenticated
from ragserve.server.identity import Identity


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_key_file_holds_names_and_hashes_never_keys(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    key = add_key(path, "billing-app", dt.date(2030, 1, 1))
    text = path.read_text()
    assert key.startswith("rsk_") and key not in text and key[4:] not in text
    assert text.startswith("billing-app  sha256:") and "expires=2030-01-01" in text
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [e.name for e in read_keys(path)] == ["billing-app"]


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ("billing sha256:abc", "expected 'NAME sha256:HEX"),
        ("bad/name sha256:" + "0" * 64, "caller name"),
        ("billing sha256:" + "0" * 64 + " expires=tomorrow", "Invalid isoformat"),
        ("billing md5:" + "0" * 32, "expected"),
    ],
)
def test_a_malformed_line_is_refused_naming_it(line: str, says: str) -> None:
    with pytest.raises(ValueError, match=f"keys:2: .*{says}"):
        parse_keys("# callers\n" + line + "\n", "keys")


def test_a_rotation_revokes_the_old_key_by_its_fingerprint(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    old, new = add_key(path, "app"), add_key(path, "app")
    old_entry = next(e for e in read_keys(path) if e.digest == digest_of(old))
    assert revoke_keys(path, "app", old_entry.fingerprint) == 1
    keys = KeyFile(path)
    assert keys.name_of(old.encode()) is None and keys.name_of(new.encode()) == "app"


def test_a_name_may_hold_two_keys_and_revoke_removes_both(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    first, second = add_key(path, "app"), add_key(path, "app")
    add_key(path, "other")
    keys = KeyFile(path)
    assert keys.name_of(first.encode()) == keys.name_of(second.encode()) == "app"
    assert revoke_keys(path, "app") == 2 and [e.name for e in read_keys(path)] == ["other"]


def test_the_file_is_re_read_when_it_changes_and_a_bad_one_lets_no_key_in(tmp_path: Path, caplog) -> None:
    path, clock = tmp_path / "keys", FakeClock()
    old = add_key(path, "app")
    keys = KeyFile(path, clock)
    new = add_key(path, "app")
    assert keys.name_of(new.encode()) is None  # looked at most once a second
    clock.now = 1.5
    assert keys.name_of(new.encode()) == "app"
    revoke_keys(path, "app")
    clock.now = 3.0
    assert keys.name_of(old.encode()) is None and keys.name_of(new.encode()) is None
    path.write_text("not a key line\n")
    add_key(tmp_path / "other", "app")  # nothing to do with this file
    clock.now = 4.5
    with caplog.at_level(logging.ERROR):
        assert keys.name_of(old.encode()) is None
    assert "no key is accepted until it is fixed" in caplog.text


def test_an_expired_key_names_nobody(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    key = add_key(path, "app", dt.date(2020, 1, 1))
    assert KeyFile(path).name_of(key.encode()) is None


def test_identity_names_the_key_holder_and_the_shared_token_names_nobody(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    key = add_key(path, "billing-app")
    identity = Identity(AccessSettings(api_keys_file=str(path), auth_token="shared"))
    assert identity.caller(f"Bearer {key}", set()) == {"billing-app"}
    assert identity.caller(f"Bearer {key}".encode(), {"cert name"}) == {"billing-app", "cert name"}
    assert identity.caller("Bearer shared", set()) == set()
    for wrong in (None, "", key, f"Bearer {key}x", "Bearer ", f"bearer {key}"):
        with pytest.raises(Unauthenticated) as refused:
            identity.caller(wrong, set())
        assert key not in str(refused.value)
    revoke_keys(path, "billing-app")


def test_identity_without_credentials_lets_everyone_in_and_pins_certificates() -> None:
    assert Identity(AccessSettings()).caller(None, set()) == set()
    pinned = Identity(AccessSettings(tls_client_ca_file="/ca.pem", tls_allowed_client_ids="alice app"))
    assert pinned.caller(None, {"alice app"}) == {"alice app"}
    with pytest.raises(PermissionDenied):
        pinned.caller(None, {"mallory"})


def test_a_missing_or_malformed_key_file_stops_the_server_from_starting(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such key file"):
        Identity(AccessSettings(api_keys_file=str(tmp_path / "absent")))
    (tmp_path / "bad").write_text("x y z w\n")
    with pytest.raises(ConfigError, match="bad:1"):
        Identity(AccessSettings(api_keys_file=str(tmp_path / "bad")))


def test_the_keys_commands_add_list_and_revoke(tmp_path: Path) -> None:
    path, runner = tmp_path / "keys", CliRunner()
    added = runner.invoke(cli, ["keys", "add", "support-bot", "--file", str(path), "--expires", "2031-02-03"])
    assert added.exit_code == 0, added.output
    key = added.stdout.splitlines()[0]
    assert KeyFile(path).name_of(key.encode()) == "support-bot"
    listed = runner.invoke(cli, ["keys", "list", "--file", str(path)])
    name, fingerprint, expiry = listed.stdout.strip().split("\t")
    assert (name, expiry) == ("support-bot", "2031-02-03") and key not in listed.stdout
    assert len(fingerprint) == 12 and fingerprint in path.read_text()
    assert runner.invoke(cli, ["keys", "revoke", "support-bot", "--file", str(path)]).exit_code == 0
    assert runner.invoke(cli, ["keys", "revoke", "support-bot", "--file", str(path)]).exit_code == 1
    assert runner.invoke(cli, ["keys", "add", "not ok", "--file", str(path)]).exit_code == 2
