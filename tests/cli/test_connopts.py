"""The connection option set every node-facing command gets (dcptool.cli.connopts)."""
from __future__ import annotations

import inspect

from dcptool.cli.connopts import ConnArgs, connection_options


def test_connection_options_replace_conn_args_in_place():
    @connection_options(timeout=True)
    def cmd(archive: str, conn_args: ConnArgs = None, json_out: bool = False):
        return archive, conn_args, json_out

    names = list(inspect.signature(cmd).parameters)
    assert names == ["archive", "cluster", "username", "password", "bucket", "cacert",
                     "no_verify", "timeout", "client_cert", "client_key",
                     "client_key_passphrase_file", "json_out"]
    archive, args, json_out = cmd(archive="a", cluster="h:1", username=None, password="pw",
                                  bucket="b", cacert=None, no_verify=True, timeout=3.0,
                                  client_cert=None, client_key=None,
                                  client_key_passphrase_file=None, json_out=True)
    assert (archive, json_out) == ("a", True)
    assert args == ConnArgs("h:1", None, "pw", "b", None, True, 3.0, None)
    o = args.options()
    assert (o.host, o.port, o.bucket, o.verify, o.timeout) == ("h", 1, "b", False, 3.0)
    assert args.options("other:2", bucket="c").address == "other:2"


def test_connection_options_without_cluster_and_with_snappy():
    @connection_options(cluster=None, snappy=True)
    def cmd(cluster: str = "", conn_args: ConnArgs = None):
        return cluster, conn_args

    names = list(inspect.signature(cmd).parameters)
    assert names == ["cluster", "username", "password", "bucket", "cacert", "no_verify",
                     "snappy", "client_cert", "client_key", "client_key_passphrase_file"]
    own, args = cmd(cluster="x", username="u", password="p", bucket="default", cacert=None,
                    no_verify=False, snappy=True, client_cert=None, client_key=None,
                    client_key_passphrase_file=None)
    assert own == "x" and args.cluster is None and args.snappy is True
    assert args.timeout == 10.0
