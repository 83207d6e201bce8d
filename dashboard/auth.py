"""Who may look and who may act on the console.

- **OIDC** when Streamlit's ``[auth]`` section is configured (``.streamlit/secrets.toml``):
  the sidebar's button calls ``st.login()``; the actor is the identity provider's
  ``email`` (else ``name``, else ``sub``).
- Otherwise the **local users file** (:mod:`app.console.users`): a sign-in form checks the
  name and password against the scrypt hashes; the actor is that name.

Viewing is open when the server is bound to loopback only (``server.address`` 127.0.0.1,
::1 or localhost). Bound to any other address (Streamlit's default, all interfaces,
included), viewing needs a signed-in user as well; and without any way to sign in (no
OIDC, no users file) the console runs **read-only** and says so at the top of every page.
Every action (ack, silence, expire) needs a signed-in user, and records that user as
``by``; there is no free-text "by" field.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import streamlit as st

from app.console.users import load_users, users_path, verify
from app.errors import ConfigError

logger = logging.getLogger(__name__)

LOOPBACK = {"127.0.0.1", "::1", "localhost"}
USER_KEY = "console_user"
FAILED_SIGN_IN_DELAY_S = 1.0


@dataclass(frozen=True)
class Access:
    """How this console is reached and how users sign in."""

    mode: Literal["oidc", "users", "none"]
    loopback: bool
    users_file: Path
    problem: str = ""

    @property
    def read_only(self) -> bool:
        return self.mode == "none"

    @property
    def banner(self) -> str:
        """What the page says at the top when something is off ("" when nothing is)."""
        if self.problem:
            return self.problem
        if self.mode == "none" and not self.loopback:
            return (
                "READ-ONLY: this console is bound beyond loopback and no sign-in is configured "
                f"(no OIDC [auth] in secrets.toml, no users file at {self.users_file}); "
                "add a user with `python -m app users add NAME` and restart"
            )
        if self.mode == "none":
            return (
                f"read-only: no users file at {self.users_file}; add a user with "
                "`python -m app users add NAME` to ack and silence"
            )
        return ""


def _oidc_configured() -> bool:
    try:
        return "auth" in st.secrets
    except Exception:  # no secrets.toml at all (Streamlit raises its own FileNotFoundError)
        return False


def access() -> Access:
    address = str(st.get_option("server.address") or "")
    loopback = address in LOOPBACK
    path = users_path()
    if _oidc_configured():
        return Access("oidc", loopback, path)
    try:
        users = load_users(path)
    except ConfigError as exc:
        return Access("none", loopback, path, problem=f"READ-ONLY: {exc}")
    return Access("users" if users else "none", loopback, path)


def current_user(acc: Access) -> str | None:
    """The signed-in user's name, or None."""
    if acc.mode == "oidc":
        user = st.user
        if not user.is_logged_in:
            return None
        for attr in ("email", "name", "sub"):
            value = user.get(attr)
            if value:
                return str(value)
        return None
    if acc.mode == "users":
        name = st.session_state.get(USER_KEY)
        return str(name) if name else None
    return None


def sidebar(acc: Access) -> str | None:
    """The sidebar's sign-in box; returns the signed-in user (or None)."""
    user = current_user(acc)
    with st.sidebar:
        if user is not None:
            st.markdown(f"signed in as **{user}**")
            if st.button("Sign out", key="sign_out"):
                if acc.mode == "oidc":
                    st.logout()
                st.session_state.pop(USER_KEY, None)
                st.rerun()
            return user
        if acc.mode == "oidc":
            st.button("Sign in", key="sign_in_oidc", on_click=st.login)
        elif acc.mode == "users":
            with st.form("sign_in"):
                st.markdown("**Sign in** to ack and silence")
                name = st.text_input("user", key="sign_in_user")
                password = st.text_input("password", type="password", key="sign_in_password")
                if st.form_submit_button("Sign in"):
                    if verify(load_users(acc.users_file), name, password):
                        st.session_state[USER_KEY] = name
                        logger.info("console sign-in: %s", name)
                        st.rerun()
                    time.sleep(FAILED_SIGN_IN_DELAY_S)
                    logger.warning("console sign-in refused for %r", name)
                    st.error("wrong user or password")
        else:
            st.caption("read-only: nobody can sign in")
    return None
