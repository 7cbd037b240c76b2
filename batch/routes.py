"""The provider API routes a scheduled refresh walks, per industry (MYDATA.md's wire protocol).

One table shared by the client (what to call) and the simulator (what to serve), so the two
can never disagree. A refresh is the list call (its pages one after another, ``limit`` at most
500, ``next_page`` an opaque cursor absent on the last page) then one detail call per item.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal
from urllib.parse import quote

MAX_PAGE_LIMIT = 500


@dataclass(frozen=True, slots=True)
class IndustryRoutes:
    """How one industry's list and detail calls look on the wire.

    List: ``GET {base}/v1/{industry}/{list_resource}?org_code=&search_timestamp=&limit=``
    (plus ``&next_page=`` after the first page); the answer carries ``{list_key}`` (items),
    ``{count_key}`` and, unless it is the last page, ``next_page``.
    Detail: ``{detail_method} {base}/v1/{industry}/{detail_resource}``: for POST the item's
    ``{id_key}`` goes in the JSON body; for GET the path holds ``{id}`` for it.
    """

    industry: str
    list_resource: str
    list_key: str
    count_key: str
    id_key: str
    detail_method: Literal["GET", "POST"]
    detail_resource: str

    @property
    def list_path(self) -> str:
        return f"/v1/{self.industry}/{self.list_resource}"

    def detail_path(self, item_id: str) -> str:
        """The detail call's path; an id in the path is one percent-encoded segment, so a
        provider's id holding ``/``, ``?``, ``#`` or ``..`` cannot reach another route."""
        return f"/v1/{self.industry}/{self.detail_resource}".replace(
            "{id}", quote(item_id, safe=""))

    @property
    def detail_route(self) -> str:
        """The detail path as a route pattern (``{id}`` left in place)."""
        return f"/v1/{self.industry}/{self.detail_resource}"


ROUTES: dict[str, IndustryRoutes] = {
    r.industry: r
    for r in (
        IndustryRoutes("bank", "accounts", "account_list", "account_cnt", "account_num",
                       "POST", "accounts/deposit/basic"),
        IndustryRoutes("card", "cards", "card_list", "card_cnt", "card_id",
                       "GET", "cards/{id}"),
        IndustryRoutes("invest", "accounts", "account_list", "account_cnt", "account_num",
                       "POST", "accounts/basic"),
        IndustryRoutes("insu", "insurances", "insu_list", "insu_cnt", "insu_num",
                       "POST", "insurances/basic"),
        IndustryRoutes("efin", "accounts", "account_list", "account_cnt", "account_id",
                       "POST", "accounts/balance"),
        IndustryRoutes("capital", "loans", "loan_list", "loan_cnt", "account_num",
                       "POST", "loans/basic"),
        IndustryRoutes("ginsu", "insurances", "insu_list", "insu_cnt", "insu_num",
                       "POST", "insurances/basic"),
        IndustryRoutes("telecom", "telecoms", "telecom_list", "telecom_cnt", "mgmt_id",
                       "POST", "bills"),
        IndustryRoutes("p2p", "lendings", "lending_list", "lending_cnt", "lending_id",
                       "POST", "lendings/basic"),
        IndustryRoutes("bond", "bonds", "bond_list", "bond_cnt", "bond_id",
                       "POST", "bonds/basic"),
        IndustryRoutes("usury", "loans", "loan_list", "loan_cnt", "account_num",
                       "POST", "loans/basic"),
    )
}

TOKEN_PATH = "/oauth/2.0/token"

API_TYPES = frozenset({"scheduled", "user-consent", "user-refresh", "user-search"})
