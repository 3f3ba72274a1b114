import json

from conftest import VECTORS

from dcptool.protocol import vbucket_of


def test_crc32_cases_from_couchbase_cli():
    cases = json.loads((VECTORS / "vbucket-hash-crc32.cbcli.json").read_text())["cases"]
    assert len(cases) == 129
    for case in cases:
        key = bytes.fromhex(case["key_utf8_hex"])
        assert vbucket_of(key, case["num_vbuckets"]) == case["vbucket"], case
        assert vbucket_of(key.decode("utf-8"), case["num_vbuckets"]) == case["vbucket"]
