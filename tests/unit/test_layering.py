"""The layering rule, checked on the source: overlay's layers (wire < net < anon < directory <
the user-node runtime and test kit) import only layers below them; overlay imports no role
package and nothing of gentorrent; role packages import overlay, never each other (except
verifier → model_node's engine package), and take from gentorrent only the command kit (cli,
config); light CLI modules never load an inference engine."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ROLES = ("user_client", "model_node", "verifier")
HEAVY = ("llama_cpp", "vllm", "torch", "transformers")


def imported_modules(path: Path) -> set[str]:
    """Every module an ``import`` statement in ``path`` names (absolute imports)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out.update(f"{node.module}.{alias.name}" for alias in node.names)
    return out


def sources(package: str) -> list[Path]:
    root = REPO / package
    return sorted(root.rglob("*.py")) if root.is_dir() else []


def top(module: str) -> str:
    return module.split(".")[0]


def test_overlay_imports_no_role_package() -> None:
    files = sources("overlay")
    assert files
    bad = {
        f"{p.relative_to(REPO)}: {m}"
        for p in files for m in imported_modules(p) if top(m) in ROLES
    }
    assert not bad, "overlay must not import role packages:\n" + "\n".join(sorted(bad))


# overlay's layers, lowest first; a module imports only from its own layer and those below it
LAYERS = ("overlay.wire", "overlay.net", "overlay.anon", "overlay.directory")


def layer_of(module: str) -> int:
    """The rank of an overlay module (one above the last named layer: overlay's root modules,
    the user-node runtime and the test kit, which use every layer)."""
    for rank, name in enumerate(LAYERS):
        if module == name or module.startswith(name + "."):
            return rank
    return len(LAYERS)


def module_of(p: Path) -> str:
    parts = p.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_overlay_layers_import_only_layers_below() -> None:
    files = sources("overlay")
    assert {layer_of(module_of(p)) for p in files} == set(range(len(LAYERS) + 1))  # every layer holds code
    bad = set()
    for p in files:
        mine = layer_of(module_of(p))
        for m in imported_modules(p):
            if top(m) == "overlay" and m != "overlay" and layer_of(m) > mine:
                bad.add(f"{p.relative_to(REPO)} ({LAYERS[mine] if mine < len(LAYERS) else 'overlay'}): {m}")
    assert not bad, "a layer of overlay imports one above it:\n" + "\n".join(sorted(bad))


def test_layering_rule_sees_an_upward_import() -> None:
    """The check above, on a made-up module: wire importing anon is caught."""
    assert layer_of("overlay.anon.onion") > layer_of("overlay.wire.messages")
    assert layer_of("overlay.directory.lists") > layer_of("overlay.net.peers") > layer_of("overlay.wire.codec")
    assert layer_of("overlay.usernode") == layer_of("overlay.testing") == len(LAYERS)


def test_overlay_imports_nothing_of_gentorrent() -> None:
    bad = {f"{p.relative_to(REPO)}: {m}" for p in sources("overlay") for m in imported_modules(p)
           if top(m) == "gentorrent"}
    assert not bad, "overlay must not import the application package:\n" + "\n".join(sorted(bad))


def test_roles_take_only_the_command_kit_from_gentorrent() -> None:
    """A node's code uses gentorrent's cli helpers and configuration; the whole-network tools
    and benches sit above every role. The command kit itself imports no role (the root CLI loads
    the roles' commands through entry points)."""
    kit = ("gentorrent", "gentorrent.cli", "gentorrent.config")
    bad: set[str] = set()
    for role in ROLES:
        for p in sources(role):
            if _is_tooling(module_of(p)):
                continue
            bad.update(f"{p.relative_to(REPO)}: {m}" for m in imported_modules(p)
                       if top(m) == "gentorrent" and not any(m == k or m.startswith(k + ".") for k in kit[1:]))
    for name in ("cli", "config"):
        path = REPO / "gentorrent" / f"{name}.py"
        bad.update(f"{path.relative_to(REPO)}: {m}" for m in imported_modules(path) if top(m) in ROLES)
    assert not bad, "\n".join(sorted(bad))


@pytest.mark.parametrize("role", ROLES)
def test_roles_do_not_import_each_other(role: str) -> None:
    bad = set()
    for p in sources(role):
        for m in imported_modules(p):
            if top(m) in ROLES and top(m) != role:
                # The one exception: verifiers score with model_node's engines.
                if role == "verifier" and m.startswith("model_node.engine"):
                    continue
                # ... and the audit loop loads the llama.cpp engine it scores with (the audit model).
                if p.relative_to(REPO).as_posix() == "verifier/audit/loop.py" and m.startswith("model_node.llama"):
                    continue
                # Verifier benchmarks (tooling, never loaded by a node) build the engine they time.
                module = ".".join(p.relative_to(REPO).with_suffix("").parts)
                if role == "verifier" and _is_tooling(module) and m.startswith("model_node.llama"):
                    continue
                if role == "verifier" and m == "model_node":
                    bad.add(f"{p.relative_to(REPO)}: {m} (import model_node.engine..., not the package)")
                    continue
                bad.add(f"{p.relative_to(REPO)}: {m}")
    assert not bad, f"{role} imports another role:\n" + "\n".join(sorted(bad))



def _is_tooling(module: str) -> bool:
    """``*.bench`` (benchmarks) and ``gentorrent.tools`` (devnet, status, local networks)."""
    parts = module.split(".")
    return "bench" in parts[1:2] or module.startswith("gentorrent.tools")


def test_no_product_module_imports_benches_or_tools() -> None:
    """A running node needs no benchmark or tooling module: benches inject what they need."""
    bad: set[str] = set()
    for package in ("overlay", "gentorrent", *ROLES):
        for p in sources(package):
            module = ".".join(p.relative_to(REPO).with_suffix("").parts)
            if _is_tooling(module):
                continue
            bad.update(f"{p.relative_to(REPO)}: {m}" for m in imported_modules(p) if _is_tooling(m))
    assert not bad, "product modules must not import benches or tools:\n" + "\n".join(sorted(bad))

def _loaded_after(code: str) -> list[str]:
    probe = (
        f"import sys, json\n{code}\n"
        f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {list(HEAVY)!r})))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         timeout=60, cwd=REPO, check=True)
    loaded: list[str] = json.loads(out.stdout.strip().splitlines()[-1])
    return loaded


def test_user_cli_loads_no_engine() -> None:
    assert _loaded_after("import user_client.cli") == []


def test_building_the_whole_cli_loads_no_engine() -> None:
    """Every role's ``register`` runs to build the parser: none may import an engine."""
    assert _loaded_after("from gentorrent.cli import build_parser; build_parser()") == []


def test_overlay_loads_no_role_package() -> None:
    code = (
        "import importlib, pkgutil, overlay\n"
        "for m in pkgutil.walk_packages(overlay.__path__, 'overlay.'):\n"
        "    importlib.import_module(m.name)\n"
        "roles = sorted(m for m in sys.modules if m.split('.')[0] in "
        f"{list(ROLES)!r})\n"
        "print(json.dumps(roles))\n"
    )
    out = subprocess.run([sys.executable, "-c", "import sys, json\n" + code], capture_output=True,
                         text=True, timeout=60, cwd=REPO, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


CLOCK_READS = {("time", "time"), ("time", "monotonic"), ("time", "time_ns"), ("time", "monotonic_ns"),
               ("trio", "current_time"), ("datetime", "now"), ("datetime", "utcnow"), ("datetime", "today")}


def test_clocks_are_read_only_in_overlay_clock() -> None:
    """Drivers take ``clock=`` (overlay/wire/clock.py); nothing else reads a clock, so MockClock and
    FakeClock drive every timeout in tests. Benchmarks measure with ``time.perf_counter``."""
    bad = set()
    for package in ("overlay", *ROLES):
        for p in sources(package):
            rel = p.relative_to(REPO)
            if rel.as_posix() == "overlay/wire/clock.py" or "bench" in rel.parts or "proto" in rel.parts:
                continue
            for node in ast.walk(ast.parse(p.read_text(), filename=str(p))):
                if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name | ast.Attribute):
                    owner = node.value.id if isinstance(node.value, ast.Name) else node.value.attr
                    if (owner, node.attr) in CLOCK_READS:
                        bad.add(f"{rel}:{node.lineno}: {owner}.{node.attr}")
    assert not bad, "read the clock through overlay.wire.clock instead:\n" + "\n".join(sorted(bad))


IO_FREE_CORES = ("verifier/audit/auditor.py", "verifier/audit/chain.py", "verifier/audit/transcripts.py",
                 "verifier/audit/tx.py", "verifier/audit/reputation.py", "verifier/audit/scoring.py",
                 "verifier/app.py", "model_node/admission.py", "verifier/audit/escrow_intake.py",
                 "overlay/directory/escrow.py", "overlay/directory/transcripts.py")
IO_MODULES = ("trio", "asyncio", "socket", "subprocess", "overlay.directory.rpc", "overlay.net")


@pytest.mark.parametrize("core", IO_FREE_CORES)
def test_protocol_cores_do_no_io(core: str) -> None:
    """Protocol cores are I/O-free and tested directly; their drivers are thin and do the I/O (the
    audit planner, ``verifier/audit/auditor.py``, is driven by ``verifier/audit/loop.py``). None of
    these cores imports trio, asyncio, sockets, processes, the RPC client or the transports."""
    imported = imported_modules(REPO / core)
    assert not [m for m in imported if any(m == io or m.startswith(io + ".") for io in IO_MODULES)]
