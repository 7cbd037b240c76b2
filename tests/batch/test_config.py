from __future__ import annotations

import pytest

from batch.config import parse_institutions
from batch.errors import ConfigError

DESIGN_EXAMPLE = '''
operator_org_code = "OPERATOR01"      # 10 letters/digits: ours, first part of x-api-tran-id
[[providers]]
org_code = "BANK000001"
industry = "bank"                     # MYDATA.md's industry codes
base_url = "http://127.0.0.1:9001"
windows = ["0030:0530", "2300:0100"]  # KST, see MYDATA.md
calls_per_second = 50                 # never exceed, whole cluster together
max_concurrency = 20                  # calls in flight at once
'''


def test_the_design_documents_own_example_loads() -> None:
    insts = parse_institutions(DESIGN_EXAMPLE, source="institutions.toml")
    (p,) = insts.providers
    assert (p.org_code, p.industry, p.calls_per_second, p.max_concurrency) == (
        "BANK000001", "bank", 50.0, 20)
    assert [str(w) for w in p.windows] == ["0030:0530", "2300:0100"]


@pytest.mark.parametrize("old, new, field, line", [
    ('"0030:0530", "2300:0100"', '"0030:0545"', "providers[0].windows", 7),
    ('industry = "bank"', 'industry = "bakery"', "providers[0].industry", 5),
    ("calls_per_second = 50", "calls_per_second = -1", "providers[0].calls_per_second", 8),
    ('org_code = "BANK000001"', 'org_code = "BANK1"', "providers[0].org_code", 4),
])
def test_a_bad_field_names_file_line_and_field(old: str, new: str, field: str,
                                               line: int) -> None:
    with pytest.raises(ConfigError) as info:
        parse_institutions(DESIGN_EXAMPLE.replace(old, new), source="inst.toml")
    msg = str(info.value)
    assert msg.startswith(f"inst.toml:{line}: field '{field}': ")
    assert "\n" not in msg


def test_duplicate_org_codes_are_refused() -> None:
    twice = DESIGN_EXAMPLE + DESIGN_EXAMPLE.split("\n", 2)[2]
    with pytest.raises(ConfigError, match="duplicate org_code 'BANK000001'"):
        parse_institutions(twice, source="inst.toml")
