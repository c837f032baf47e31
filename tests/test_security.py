"""Digest authentication, ACL policies and TLS, against real ZooKeeper servers."""

from __future__ import annotations

import pytest
import trio

from framework import ZooKeeperEnsemble, errors
from framework.zk import Session
from framework.zk.acl import TlsConfig, resolve_security

OWNER = "app:s3cret"


async def test_creator_acl_refuses_unauthenticated_writes(zk_hosts: str, chroot: str) -> None:
    with trio.fail_after(20):
        async with Session(zk_hosts, chroot=chroot, auth=OWNER, acl="creator") as owner:
            await owner.create("/jobs/a", b"one", makepath=True)
            await owner.transaction().create("/jobs/b", b"two").commit()
            async with Session(zk_hosts, chroot=chroot, auth=None, acl=None) as intruder:
                for attempt in (
                    lambda: intruder.set("/jobs/a", b"mine"),
                    lambda: intruder.delete("/jobs/b"),
                    lambda: intruder.create("/jobs/c"),
                    lambda: intruder.get("/jobs/a"),
                ):
                    with pytest.raises(errors.NoAuthError) as refused:
                        await attempt()
                    assert "NoAuth" in str(refused.value)
                    assert "FRAMEWORK_ZK_AUTH" in str(refused.value)
                print("intruder:", refused.value)
                with pytest.raises(errors.TransactionFailedError) as failed:
                    await intruder.transaction().delete("/jobs/a").commit()
                assert isinstance(failed.value.cause, errors.NoAuthError)
            async with Session(zk_hosts, chroot=chroot, auth="other:pw") as stranger:
                with pytest.raises(errors.NoAuthError, match="authenticated as 'other'"):
                    await stranger.delete("/jobs/a")
            # the same credentials in another session (another process) may do everything
            async with Session(zk_hosts, chroot=chroot, auth=OWNER) as colleague:
                await colleague.set("/jobs/a", b"two")
                await colleague.create("/jobs/a/child")
                await colleague.delete("/jobs/a/child")
                await colleague.delete("/jobs/b")
            assert (await owner.get("/jobs/a"))[0] == b"two"
            assert await owner.children("/jobs") == ["a"]


async def test_creator_read_lets_viewers_read_only(zk_hosts: str, chroot: str) -> None:
    with trio.fail_after(20):
        async with Session(zk_hosts, chroot=chroot, auth=OWNER, acl="creator-read") as owner:
            await owner.create("/app/config", b'{"size": 128}', makepath=True)
            async with Session(zk_hosts, chroot=chroot, auth=None) as viewer:
                assert (await viewer.get("/app/config"))[0] == b'{"size": 128}'
                assert await viewer.children("/app") == ["config"]
                with pytest.raises(errors.NoAuthError):
                    await viewer.set("/app/config", b"{}")
                with pytest.raises(errors.NoAuthError):
                    await viewer.create("/app/extra")
                with pytest.raises(errors.NoAuthError):
                    await viewer.delete("/app/config")


async def test_environment_configures_every_session(
    zk_hosts: str, chroot: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FRAMEWORK_ZK_AUTH", OWNER)
    monkeypatch.setenv("FRAMEWORK_ZK_ACL", "creator-read")
    with trio.fail_after(20):
        async with Session(zk_hosts, chroot=chroot) as from_env:
            assert from_env.security.credentials == ("app", "s3cret")
            assert from_env.security.policy == "creator-read"
            await from_env.create("/queue/item", b"x", makepath=True)
        monkeypatch.delenv("FRAMEWORK_ZK_AUTH")
        monkeypatch.delenv("FRAMEWORK_ZK_ACL")
        async with Session(zk_hosts, chroot=chroot) as anonymous:
            assert (await anonymous.get("/queue/item"))[0] == b"x"
            with pytest.raises(errors.NoAuthError):
                await anonymous.delete("/queue/item")


def test_bad_security_settings_are_configuration_errors() -> None:
    env: dict[str, str] = {}
    assert resolve_security(environ=env).policy == "open"
    assert resolve_security(auth="u:p", environ=env).policy == "creator"
    assert resolve_security(environ={"FRAMEWORK_ZK_AUTH": "u:p:q"}).credentials == ("u", "p:q")
    for kwargs in (
        {"auth": "no-colon"},
        {"auth": ":pw"},
        {"auth": None, "acl": "creator"},
        {"auth": "u:p", "acl": "everyone"},
        {"tls": "yes"},
    ):
        with pytest.raises(errors.ConfigurationError):
            resolve_security(environ=env, **kwargs)
    with pytest.raises(errors.ConfigurationError, match="expected 1 or 0"):
        resolve_security(environ={"FRAMEWORK_ZK_TLS": "maybe"})
    with pytest.raises(errors.ConfigurationError, match="not a readable file"):
        resolve_security(environ={"FRAMEWORK_ZK_TLS_CA": "/nonexistent/ca.pem"})
    secured = resolve_security(auth="u:p", environ=env)
    assert "p" not in str(secured.describe().values())


async def test_tls_connection_end_to_end(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    with ZooKeeperEnsemble(1, tls=True, base_dir=tmp_path) as server:
        monkeypatch.setenv("FRAMEWORK_ZK_TLS_CA", str(server.tls_ca))  # implies TLS
        with trio.fail_after(30):
            async with Session(server.tls_connect_string, auth=OWNER) as secure:
                assert secure.security.tls == TlsConfig(ca=str(server.tls_ca))
                await secure.create("/over-tls", b"encrypted on the wire")
                assert (await secure.get("/over-tls"))[0] == b"encrypted on the wire"
                async with Session(server.connect_string, tls=None, auth=None) as plain:
                    with pytest.raises(errors.NoAuthError):  # ACLs hold on either port
                        await plain.set("/over-tls", b"")
            # TLS to the plain port never completes a handshake: a clear error, not a hang
            with pytest.raises(errors.NotConnectedError, match="with TLS"):
                async with Session(server.connect_string, connect_timeout=2.0):
                    pass
