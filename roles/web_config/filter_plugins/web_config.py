"""bcrypt for exporter-toolkit's basic_auth_users, stable across runs.

A fresh random salt would change the hash, and so the file, on every run; the salt here
is derived from the host, the user and the password, so a converge that changes nothing
rewrites nothing, while each host and each password still gets a salt of its own.
"""

from __future__ import annotations

import base64
import hashlib

import bcrypt

# bcrypt's own base64 alphabet (./A-Za-z0-9), which the salt must be written in
_STD = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
_BCRYPT = b"./ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"


def web_config_bcrypt(password: str, *salt_parts: str, rounds: int = 10) -> str:
    """bcrypt hash of password, its 16-byte salt taken from sha256 of salt_parts and password."""
    seed = hashlib.sha256("\0".join((*salt_parts, password)).encode()).digest()[:16]
    salt22 = base64.b64encode(seed).translate(bytes.maketrans(_STD, _BCRYPT))[:22]
    # the 22nd character carries only 2 of its 6 bits: bcrypt keeps those, so the hash is canonical
    salt = b"$2b$%02d$" % rounds + salt22
    return bcrypt.hashpw(password.encode(), salt).decode()


class FilterModule:
    def filters(self):
        return {"web_config_bcrypt": web_config_bcrypt}
