"""Folders at a URL (``s3://bucket/run1``, any fsspec file system) as checkpoint storage: the
:class:`~paratrain.checkpoint.storage.Storage` backend of every URL without one of its own, with
errors that name the fix.

    check_url("s3://bucket/run1", "ckpt_dir")            # ConfigError now: no s3fs, bad protocol
    storage = FsspecStorage.open("s3://bucket/run1", {"endpoint_url": "http://127.0.0.1:9000"})
    storage.probe()                      # ConfigError unless it can write, list and delete there
    storage.list("step-00000010")        # {"manifest.json": Entry(size=..., ...), "dcp/...": ...}
    storage.put([(Path("staging/step-00000010/trainer.pt"), "step-00000010/trainer.pt")])
    storage.get("step-00000010/trainer.pt", start=0, end=8)
    storage.delete(["step-00000010/manifest.json"])

Endpoints and credentials come the fsspec way: the environment (``AWS_ENDPOINT_URL``,
``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_PROFILE``, ...) and the options handed to
``fsspec.url_to_fs`` (``RunConfig.ckpt_storage_options``). fsspec and the protocol's package
(s3fs for ``s3://``) are imported only when a URL is used: ``pip install 'paratrain[s3]'``.
"""

from __future__ import annotations

import contextlib
import datetime
import re
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any, TypeVar

from paratrain.checkpoint.formats import describe
from paratrain.checkpoint.storage import Entry, Source, url_of
from paratrain.core.paths import URL as _URL
from paratrain.core.paths import is_url as is_url  # where the checkpoint modules look
from paratrain.errors import ConfigError, ParatrainError, StorageError

T = TypeVar("T")
_MANGLED = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]+:/[^/]")
_INSTALL = "pip install 'paratrain[s3]'"
# Object stores have no folders: writing a key needs no parent, and fsspec's makedirs there would
# create a missing bucket instead of reporting it.
_FLAT = {"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl", "oss", "oci", "r2", "tos"}
_SECRET = re.compile(r"key|secret|token|password|credential|sas|signature", re.IGNORECASE)


def looks_mangled(value: object) -> bool:
    """True for a path like ``s3:/bucket/x``: a URL that went through ``pathlib.Path``, or was
    typed with one slash (a local folder named ``s3:`` is far less likely than a typo)."""
    return not is_url(value) and _MANGLED.match(str(value)) is not None


def check_url(url: str, what: str, error: type[ParatrainError] = ConfigError) -> None:
    """Raise ``error`` unless ``url`` names a folder of a file system fsspec can open here (no
    network is used: the package, the protocol and the shape of the URL are checked)."""
    match = _URL.match(url)
    assert match is not None, url
    protocol, rest = match.groups()
    if not rest.strip("/") or (protocol in _FLAT and rest.startswith("/")):
        raise error(
            f"{what} {url!r} names no bucket{'' if rest.strip('/') else ' or folder'}"
            f"{' (three slashes after the protocol)' if rest.startswith('/') else ''}. Pass e.g. "
            f"{what}='{protocol}://my-bucket/run1'."
        )
    try:
        import fsspec
    except ImportError:
        raise error(
            f"{what} {url!r} is a URL: checkpoints on object storage need fsspec and the "
            f"protocol's package. Install them with {_INSTALL} (s3fs for s3://)."
        ) from None
    try:
        fsspec.get_filesystem_class(protocol)
    except ValueError:
        known = fsspec.available_protocols()
        common = [p for p in ("s3", "gs", "az", "abfs", "hdfs", "sftp", "file") if p in known]
        raise error(
            f"{what} {url!r} uses the protocol {protocol!r}, which fsspec does not know. Known: "
            f"{', '.join(common)}, ... ({len(known)} in all, see fsspec.available_protocols()). "
            "Use one of them (e.g. s3://bucket/run1) or a local folder path."
        ) from None
    except ImportError as err:
        hint = _INSTALL if protocol in ("s3", "s3a") else f"{err} (its fsspec package)"
        raise error(f"{what} {url!r} needs the package for {protocol}://: {hint}.") from None


class FsspecStorage:
    """One folder at a URL, through fsspec: the :class:`~paratrain.checkpoint.storage.Storage`
    of every URL without a backend of its own. Every failure is a :class:`StorageError` (or the
    ``error`` given to :meth:`open`) that names the URL, the operation and the likely fix."""

    def __init__(self, fs: Any, root: str, url: str) -> None:
        self.fs = fs
        self.root = root.rstrip("/")
        self.url = url.rstrip("/")
        protocols = fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)
        self.flat = bool(_FLAT.intersection(protocols))

    @classmethod
    def open(
        cls,
        url: str,
        options: Mapping[str, Any] | None = None,
        *,
        what: str = "ckpt_dir",
        error: type[ParatrainError] = ConfigError,
    ) -> FsspecStorage:
        """The folder at ``url``; ``options`` go to ``fsspec.url_to_fs``."""
        check_url(url, what, error)
        import fsspec

        try:  # an instance of its own: settings from the environment are read now, not cached
            fs, root = fsspec.url_to_fs(url, skip_instance_cache=True, **dict(options or {}))
        except Exception as err:
            raise error(
                f"{what} {url!r} cannot be opened with the storage options "
                f"{sorted(options or {})} ({describe(err)}). Check ckpt_storage_options: they "
                "are handed to fsspec.url_to_fs."
            ) from None
        return cls(fs, root, url)

    def __repr__(self) -> str:
        return f"FsspecStorage({self.url!r})"

    def _path(self, rel: str) -> str:
        return f"{self.root}/{rel}" if rel else self.root

    def _call(
        self, fn: Callable[[], T], action: str, rel: str, error: type[ParatrainError] = StorageError
    ) -> T:
        try:
            # fsspec caches listings, also below the folder asked about (and answers "missing"
            # from them); the objects change under other writers, so every call looks afresh.
            self.fs.invalidate_cache()
            return fn()
        except Exception as err:  # fsspec, botocore and aiohttp raise their own kinds
            raise error(explain(err, f"{action} {url_of(self, rel)}", self.url)) from None

    def probe(self) -> None:
        """ConfigError unless a small object can be written, listed and deleted here."""
        rel = f".paratrain-probe-{uuid.uuid4().hex[:12]}"

        def write_list_delete() -> None:
            if not self.flat:
                self.fs.makedirs(self.root, exist_ok=True)
            self.fs.pipe_file(self._path(rel), b"paratrain checks that it can write here\n")
            self.fs.find(self.root, maxdepth=1)
            self.fs.rm_file(self._path(rel))

        doing = "writing, listing and deleting a test object in"
        self._call(write_list_delete, doing, "", ConfigError)

    def list(self, under: str = "") -> dict[str, Entry]:
        """Every object below ``under`` (all of them by default), by path relative to it."""
        base = self._path(under)
        found = self._call(lambda: self.fs.find(base, detail=True), "listing", under)
        out = {}
        for key, info in found.items():
            key = key.rstrip("/")
            if info.get("type") == "directory":
                continue
            if key == base:  # the URL names one object
                out[""] = _entry(info)
            elif key.startswith(base + "/"):
                out[key[len(base) + 1 :]] = _entry(info)
        return out

    def get(self, key: str, *, start: int = 0, end: int | None = None) -> bytes | None:
        """Bytes ``[start, end)`` of one object; None when it does not exist."""

        def cat() -> bytes | None:
            try:
                return bytes(self.fs.cat_file(self._path(key), start=start, end=end))
            except FileNotFoundError:
                return None

        return self._call(cat, "reading", key)

    def read_many(self, rels: Sequence[str]) -> dict[str, bytes | None]:
        """The bytes of each object (None where it does not exist), read concurrently."""
        if not rels:
            return {}
        paths = {self._path(rel): rel for rel in rels}
        got = self._call(lambda: self.fs.cat(list(paths), on_error="return"), "reading", rels[0])
        out: dict[str, bytes | None] = {}
        for path, rel in paths.items():
            value = got.get(path, FileNotFoundError(path))
            if isinstance(value, FileNotFoundError):
                out[rel] = None
            elif isinstance(value, BaseException):
                raise StorageError(explain(value, f"reading {url_of(self, rel)}", self.url))
            else:
                out[rel] = bytes(value)
        return out

    def put(self, items: Sequence[tuple[Source, str]]) -> None:
        """Copy each local file or bytes to its key, concurrently (large files in parts)."""
        if not items:
            return
        files = [(str(src), self._path(key)) for src, key in items if not isinstance(src, bytes)]
        data = {self._path(key): src for src, key in items if isinstance(src, bytes)}

        def put() -> None:
            if not self.flat:
                keys = [r for _, r in files] + list(data)
                for parent in sorted({str(PurePosixPath(r).parent) for r in keys}):
                    self.fs.makedirs(parent, exist_ok=True)
            if files:
                self.fs.put([lp for lp, _ in files], [rp for _, rp in files])
            if data:
                self.fs.pipe(data)

        self._call(put, "uploading to", items[0][1] if len(items) == 1 else "")

    def commit(self, key: str, data: bytes) -> None:
        """Write ``key`` last: a PUT of one object is atomic on object stores."""
        self.put([(data, key)])

    def download_many(self, pairs: Sequence[tuple[str, Path]]) -> None:
        """Copy each object to its local path, concurrently."""
        if not pairs:
            return
        rpaths, lpaths = [self._path(r) for r, _ in pairs], [str(local) for _, local in pairs]
        self._call(
            lambda: self.fs.get(rpaths, lpaths),
            "downloading",
            pairs[0][0] if len(pairs) == 1 else "",
        )

    def delete(self, keys: Iterable[str], *, recursive: bool = False) -> None:
        """Delete objects (with ``recursive``, everything below each path); missing is fine."""
        rels = list(keys)
        paths = [self._path(rel) for rel in rels]

        def rm() -> None:
            try:
                self.fs.rm(paths, recursive=recursive)
            except FileNotFoundError:  # some file systems stop at the first missing path
                for path in paths:
                    with contextlib.suppress(FileNotFoundError):
                        self.fs.rm(path, recursive=recursive)

        if paths:
            self._call(rm, "deleting", rels[0] if len(rels) == 1 else "")


def _entry(info: Mapping[str, Any]) -> Entry:
    when = info.get("LastModified", info.get("mtime", info.get("updated", 0.0)))
    if isinstance(when, datetime.datetime):
        modified = when.timestamp()
    elif isinstance(when, (int, float)):
        modified = float(when)
    else:
        modified = 0.0
    tag = str(info.get("ETag") or info.get("etag") or info.get("md5Hash") or "")
    return Entry(size=int(info.get("size") or 0), modified=modified, tag=tag)


def explain(err: BaseException, doing: str, url: str) -> str:
    """``<doing> failed (<error>). <what to check>``: one paragraph for a failed operation on
    the folder at ``url``."""
    name, text = type(err).__name__, str(err).lower()
    if isinstance(err, ImportError):
        hint = f"A package is missing: {_INSTALL} (s3fs for s3://)."
    elif "credential" in name.lower() or "no credentials" in text:
        hint = (
            "No credentials were found: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or "
            "AWS_PROFILE), or pass key= and secret= in ckpt_storage_options."
        )
    elif "connect" in name.lower() or isinstance(err, (ConnectionError, TimeoutError)):
        hint = (
            "The storage endpoint cannot be reached: check AWS_ENDPOINT_URL (or endpoint_url "
            "in ckpt_storage_options' client_kwargs), the network, and that the service runs."
        )
    elif isinstance(err, FileNotFoundError) and "bucket" in text and _bucket(url):
        hint = f"The bucket does not exist: create it first (e.g. `aws s3 mb s3://{_bucket(url)}`)."
    elif "ParamValidation" in name and "bucket" in text:
        hint = "Fix the bucket name in the URL (S3's naming rules are quoted above)."
    elif isinstance(err, PermissionError) or "denied" in text or "forbidden" in text:
        hint = (
            "Access was denied: the credentials must allow listing, reading, writing and "
            "deleting objects under this URL."
        )
    else:
        hint = "Check the URL, the credentials and ckpt_storage_options."
    return f"{doing} failed ({describe(err)}). {hint}"


def _bucket(url: str) -> str:
    """The bucket (first path part) of an object store URL; '' when it is empty."""
    return url.split("://", 1)[-1].split("/", 1)[0]


def relabel(value: T, local: Path, url: str) -> T:
    """``value`` (text, or lists and dicts of it) with the local copy's path replaced by ``url``."""
    if isinstance(value, str):
        return value.replace(str(local), url)  # type: ignore[return-value]
    if isinstance(value, dict):
        return {k: relabel(v, local, url) for k, v in value.items()}  # type: ignore[return-value]
    if isinstance(value, list):
        return [relabel(v, local, url) for v in value]  # type: ignore[return-value]
    return value


def redacted(options: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """``options`` with the values of secret-looking keys (key, secret, token, ...) hidden."""
    if options is None:
        return None
    return {
        k: "<hidden>" if _SECRET.search(str(k)) else redacted(v) if isinstance(v, Mapping) else v
        for k, v in options.items()
    }
