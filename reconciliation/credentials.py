"""Adapter secrets at rest: encrypted with a key derived from ``SECRET_KEY`` (Fernet), never
shown after saving, never logged or exported. A secret that no longer decrypts (the
``SECRET_KEY`` changed) reads as missing, which an adapter call reports as refused."""

from __future__ import annotations

import base64
import hashlib

from cryptography.fernet import Fernet, InvalidToken
from django.conf import settings


def _fernet() -> Fernet:
    key = hashlib.sha256(b"approval-console adapter credentials:" + settings.SECRET_KEY.encode())
    return Fernet(base64.urlsafe_b64encode(key.digest()))


def encrypt(secret: str) -> str:
    return _fernet().encrypt(secret.encode()).decode()


def decrypt(token: str) -> str:
    try:
        return _fernet().decrypt(token.encode()).decode()
    except InvalidToken:
        return ""
