"""``geolens cache path|verify|clear``: the converted-model cache (:mod:`geolens.model_cache`).

- ``path`` prints the cache folder (``$GEOLENS_CACHE``, else ``~/.cache/geolens``).
- ``verify`` digests every file of every converted model against its manifest and prints one
  line per model (exit 1 if any is damaged; the next load converts it again).
- ``clear [NAME …]`` removes the converted models (all, or those named), their locks and the
  temporary folders of interrupted conversions.

Example::

    geolens cache verify
"""

from __future__ import annotations


def run(args) -> int:
    from geolens import model_cache
    from geolens.errors import UsageError
    from geolens.models import MODELS

    root = model_cache.models_dir()
    if args.action == "path":
        print(model_cache.cache_dir())
        return 0
    unknown = [n for n in args.names if n not in MODELS]
    if unknown:
        raise UsageError(f"unknown model {unknown[0]!r} (cached models are named {', '.join(sorted(MODELS))})")
    if args.action == "clear":
        removed = [p for name in (args.names or [None]) for p in model_cache.clear(name, root=root)]
        print(f"removed {len(removed)} item(s) from {root}" if removed else f"nothing to remove in {root}")
        return 0
    folders = [root / f"{n}-f32" for n in args.names] if args.names else model_cache.cached_folders(root)
    if not folders:
        print(f"no converted model in {root}")
        return 0
    bad = 0
    for folder in folders:
        name = folder.name.removesuffix("-f32")
        spec = MODELS.get(name)
        check = model_cache.verify(folder, spec.source() if spec else None, contents=True)
        if check.ok:
            print(f"{name}: ok ({check.bytes / 1e6:.0f} MB verified in {check.seconds:.2f} s) {folder}")
        else:
            bad += 1
            print(f"{name}: DAMAGED ({check.reason}) {folder}; the next load converts it again")
    return 1 if bad else 0


def register(subparsers) -> None:
    p = subparsers.add_parser("cache", help="the converted-model cache: path, verify, clear")
    p.add_argument(
        "action", choices=["path", "verify", "clear"], help="print the folder, check every file, or remove models"
    )
    p.add_argument("names", nargs="*", help="models to verify or clear (default: all)")
    p.set_defaults(func=run)
