"""Bearer tokens for non-local principals: ``tokens.json`` + ``tokens.key``.

See docs/security.md, Tokens. The kernel verifies bearers and the CLI manages them, so
this file format lives outside ``kernel/`` and imports nothing else of the package.

A bearer is 32 random bytes shown once as ``shoal_<urlsafe base64>``.  Only an
HMAC-SHA256 of it, keyed by a per-store secret in ``tokens.key``, is stored, so a leaked
``tokens.json`` alone does not let anyone attach.  Verification computes the digest once
and compares it with every record in constant time, without stopping at the first match.

The CLI (``shoal token create|list|revoke``) and the kernel are separate processes over
the same file: writers serialise read-modify-write through ``flock`` on ``tokens.lock``
and replace the file atomically; the kernel re-reads it whenever the (inode, size,
mtime_ns, ctime_ns) identity of it or of the key changes, so a revocation applies on the
next ``verify`` without a restart.  Each write also gives the file an mtime strictly
later than the one it replaces, so a coarse-clock filesystem cannot hide an edit that
keeps the size and happens to reuse the inode.

A corrupt file makes ``verify`` fail closed (no principal) and ``create``/``revoke``/
``list`` raise ``TokenStoreError`` rather than overwrite it.  ``create`` prunes records
that have already expired.
"""

from __future__ import annotations

import base64
import builtins
import contextlib
import fcntl
import hashlib
import hmac
import os
import secrets
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

BEARER_PREFIX = "shoal_"
BEARER_BYTES = 32
KEY_BYTES = 32
_BEARER_LEN = len(BEARER_PREFIX) + 43  # 32 bytes → 43 base64 chars without padding
_MAX_PRINCIPAL = 256
_MAX_LABEL = 256


class TokenStoreError(Exception):
    """The token files cannot be used (corrupt, wrong permissions, bad argument)."""


def _now() -> float:
    return time.time()


def _rfc3339(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _parse_ts(value: Any) -> float | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def new_bearer() -> str:
    raw = secrets.token_bytes(BEARER_BYTES)
    return BEARER_PREFIX + base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


@dataclass(frozen=True, slots=True)
class _Loaded:
    identity: tuple[int, ...] | None
    records: tuple[dict[str, Any], ...]
    expiries: tuple[float | None, ...]
    key: bytes | None
    ok: bool  # False when the file is corrupt: verify then fails closed


class TokenStore:
    """The token files of one state dir; safe to share between threads and processes."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.key_path = self.path.with_name(self.path.stem + ".key")
        self.lock_path = self.path.with_name(self.path.stem + ".lock")
        self._mutex = threading.Lock()
        self._loaded: _Loaded | None = None

    # --- public API ----------------------------------------------------------------

    def create(
        self, principal: str, ttl_s: float | None = None, label: str | None = None
    ) -> tuple[dict[str, Any], str]:
        """Mint a bearer for ``principal``; returns (record without digest, bearer)."""
        if (
            not isinstance(principal, str)
            or not principal.strip()
            or len(principal) > _MAX_PRINCIPAL
            or not principal.isprintable()
        ):
            raise TokenStoreError("principal must be a printable, non-empty string")
        if ttl_s is not None and not (isinstance(ttl_s, int | float) and ttl_s > 0):
            raise TokenStoreError("ttl must be a positive number of seconds")
        if label is not None and (len(label) > _MAX_LABEL or not label.isprintable()):
            raise TokenStoreError("label must be printable and at most 256 characters")
        with self._locked():
            key = self._key(create=True)
            assert key is not None  # create=True makes one when missing
            records = self._read_records(strict=True)
            now = _now()
            # Housekeeping: records that have expired can never verify again.
            records = [r for r in records if (_parse_ts(r.get("expires")) or now + 1) > now]
            taken = {r.get("id") for r in records}
            token_id = secrets.token_hex(4)
            while token_id in taken:
                token_id = secrets.token_hex(4)
            bearer = new_bearer()
            record: dict[str, Any] = {
                "id": token_id,
                "principal": principal,
                "label": label,
                "created": _rfc3339(now),
            }
            if label is None:
                del record["label"]
            if ttl_s is not None:
                record["expires"] = _rfc3339(now + ttl_s)
            record["digest"] = self._digest(key, bearer)
            records.append(record)
            self._write_records(records)
        public = {k: v for k, v in record.items() if k != "digest"}
        return public, bearer

    def list(self) -> list[dict[str, Any]]:
        """Every record (never the digest), with ``expired`` computed now."""
        now = _now()
        out = []
        for r in self._read_records(strict=True):
            item = {k: v for k, v in r.items() if k != "digest"}
            exp = _parse_ts(r.get("expires"))
            item["expired"] = exp is not None and exp <= now
            out.append(item)
        return out

    def revoke(self, id_or_principal: str) -> int:
        """Remove tokens whose id or principal equals the argument; returns how many."""
        with self._locked():
            records = self._read_records(strict=True)
            kept = [
                r
                for r in records
                if r.get("id") != id_or_principal and r.get("principal") != id_or_principal
            ]
            removed = len(records) - len(kept)
            if removed:
                self._write_records(kept)
        return removed

    def verify(self, bearer: str) -> str | None:
        """The principal of a valid, unexpired bearer; None otherwise."""
        if (
            not isinstance(bearer, str)
            or len(bearer) != _BEARER_LEN
            or not bearer.startswith(BEARER_PREFIX)
        ):
            return None  # the shape is public; rejecting it early leaks nothing
        loaded = self._current()
        if not loaded.ok or loaded.key is None:
            return None
        digest = self._digest(loaded.key, bearer)
        found: int | None = None
        for i, record in enumerate(loaded.records):
            stored = record.get("digest")
            same = hmac.compare_digest(digest, stored if isinstance(stored, str) else "")
            if same and found is None:
                found = i
        if found is None:
            return None
        expires = loaded.expiries[found]
        if expires is not None and expires <= _now():
            return None
        principal = loaded.records[found].get("principal")
        return principal if isinstance(principal, str) and principal else None

    # --- files ---------------------------------------------------------------------

    @staticmethod
    def _digest(key: bytes, bearer: str) -> str:
        return hmac.new(key, bearer.encode("utf-8"), hashlib.sha256).hexdigest()

    def _ensure_dir(self) -> None:
        parent = self.path.parent
        if not parent.exists():
            parent.mkdir(parents=True, mode=0o700, exist_ok=True)
            os.chmod(parent, 0o700)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self._ensure_dir()
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the flock

    def _key(self, create: bool) -> bytes | None:
        try:
            with open(self.key_path, "rb") as fh:
                key = fh.read(KEY_BYTES + 1)
        except FileNotFoundError:
            if not create:
                return None
            key = secrets.token_bytes(KEY_BYTES)
            self._atomic_write(self.key_path, key)
            return key
        if len(key) != KEY_BYTES:
            raise TokenStoreError(f"{self.key_path}: expected {KEY_BYTES} bytes")
        return key

    def _read_records(self, strict: bool) -> builtins.list[dict[str, Any]]:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return []
        try:
            doc = orjson.loads(data)
            records = doc["tokens"]
            if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
                raise TypeError("tokens must be a list of objects")
        except (orjson.JSONDecodeError, KeyError, TypeError) as e:
            if strict:
                raise TokenStoreError(f"{self.path}: corrupt token file ({e})") from e
            raise
        return records

    def _write_records(self, records: builtins.list[dict[str, Any]]) -> None:
        data = orjson.dumps({"version": 1, "tokens": records}, option=orjson.OPT_INDENT_2)
        try:
            previous = os.stat(self.path).st_mtime_ns
        except FileNotFoundError:
            previous = None
        self._atomic_write(self.path, data + b"\n", not_before_ns=previous)

    @staticmethod
    def _atomic_write(path: Path, data: bytes, not_before_ns: int | None = None) -> None:
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fchmod(fh.fileno(), 0o600)
                if not_before_ns is not None:
                    mtime = os.fstat(fh.fileno()).st_mtime_ns
                    if mtime <= not_before_ns:  # keep every version's mtime distinct
                        os.utime(fh.fileno(), ns=(not_before_ns + 1, not_before_ns + 1))
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise

    def _identity(self) -> tuple[int, ...] | None:
        """What changes whenever either file is rewritten (the key too: fail closed)."""
        out: list[int] = []
        for path in (self.path, self.key_path):
            try:
                st = os.stat(path)
            except FileNotFoundError:
                out += [-1] * 5
                continue
            out += [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]
        return tuple(out)

    def _current(self) -> _Loaded:
        """The parsed file, re-read only when its identity has changed."""
        with self._mutex:
            identity = self._identity()
            if self._loaded is not None and self._loaded.identity == identity:
                return self._loaded
            try:
                records = tuple(self._read_records(strict=False))
                key = self._key(create=False) if records else None
                ok = True
            except (orjson.JSONDecodeError, KeyError, TypeError, TokenStoreError, OSError):
                records, key, ok = (), None, False
            expiries = tuple(
                _parse_ts(r.get("expires")) if "expires" in r else None for r in records
            )
            # An `expires` that does not parse fails closed: treat it as already past.
            expiries = tuple(
                0.0 if ("expires" in r and e is None) else e
                for r, e in zip(records, expiries, strict=True)
            )
            self._loaded = _Loaded(identity, records, expiries, key, ok)
            return self._loaded
