"""tools/check_layers.py fails on each rule it enforces (a small fake tree per rule).

Runs without torch: `python -m pytest tests/lint -q` (ctest: check_layers_pytest).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Dict, List

import pytest

_TOOL = Path(__file__).resolve().parents[2] / "tools" / "check_layers.py"
_spec = importlib.util.spec_from_file_location("check_layers", _TOOL)
assert _spec is not None and _spec.loader is not None
check_layers = importlib.util.module_from_spec(_spec)
sys.modules["check_layers"] = check_layers
_spec.loader.exec_module(check_layers)

RULES = """
test_files = ["*_test.cc"]
tests_may_include = ["testing"]

[[folder]]
path = "base"
may_include = []
note = "the bottom"

[[folder]]
path = "mid"
may_include = ["base"]
note = "above base"

[[folder.part]]
files = ["bridge.*"]
may_include = ["side/api.h"]
note = "one file may see one header of side"

[[folder]]
path = "side"
may_include = ["base"]

[[folder]]
path = "top"
may_include = ["mid", "side", "base"]

[[folder]]
path = "testing"
may_include = ["base", "mid", "top"]

[[env_read]]
path = "base/"
why = "discovery"

[[env_read]]
path = "py/env.py"
why = "the Python mirror"
"""


# "TPU_", spelled so that the check, run on this repository, sees no read here.
HW = "TP" + "U_"


def header(path: str, body: str = "") -> str:
    guard = check_layers.guard_for(path)
    return f"#ifndef {guard}\n#define {guard}\n{body}\n#endif  // {guard}\n"


CLEAN: Dict[str, str] = {
    "base/a.h": header("base/a.h", "namespace p::base { int A(); }"),
    "base/a.cc": '#include "base/a.h"\n#include <cstdlib>\n'
                 'int p::base::A() { return std::getenv("TPU_WORKER_ID") != nullptr; }\n',
    "mid/b.h": header("mid/b.h", '#include "base/a.h"'),
    "mid/b.cc": '#include "mid/b.h"\n#include "absl/status/status.h"\n'
                'const char* x = getenv("TPU_DIST_HOST_ID");\n',
    "mid/b_test.cc": '#include "mid/b.h"\n#include "testing/ranks.h"\n#include "gtest/gtest.h"\n'
                     "using ::testing::HasSubstr;\n",
    "mid/bridge.cc": '#include "side/api.h"\n',
    "side/api.h": header("side/api.h"),
    "side/internal.h": header("side/internal.h"),
    "top/c.cc": '#include "side/api.h"\n#include "mid/b.h"\n',
    "testing/ranks.h": header("testing/ranks.h", '#include "mid/b.h"\nnamespace p::test_support {}'),
    "py/env.py": 'import os\nX = os.environ.get("' + HW + 'WORKER_ID")\n',
    "py/user.py": 'import os\nY = os.environ.get("TPU_DIST_JOB_ID")\n',
}


def make_tree(tmp_path: Path, files: Dict[str, str]) -> Path:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "layers.toml").write_text(RULES)
    rules = check_layers.load_rules(tmp_path / "docs" / "layers.toml")
    (tmp_path / "docs" / "architecture.md").write_text(
        f"# Layers\n\n{check_layers.BEGIN}\n{check_layers.render(rules)}\n{check_layers.END}\n")
    for path, text in files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    return tmp_path


def problems(tmp_path: Path, changes: Dict[str, str]) -> List[str]:
    root = make_tree(tmp_path, {**CLEAN, **changes})
    rules = check_layers.load_rules(root / "docs" / "layers.toml")
    report = check_layers.check(root, rules)
    return report.problems + check_layers.doc_problems(rules, root / "docs" / "architecture.md")


def test_the_clean_tree_passes(tmp_path: Path) -> None:
    assert problems(tmp_path, {}) == []
    assert check_layers.main(["--root", str(tmp_path)]) == 0


def test_an_include_from_a_lower_layer_up_fails(tmp_path: Path) -> None:
    found = problems(tmp_path, {"base/up.cc": '#include "mid/b.h"\n'})
    assert any(p.startswith("base/up.cc:1: includes mid/b.h") for p in found), found


def test_a_part_allows_only_its_files_and_headers(tmp_path: Path) -> None:
    found = problems(tmp_path, {"mid/other.cc": '#include "side/api.h"\n',
                                "mid/bridge2.cc": '#include "side/internal.h"\n'})
    assert any(p.startswith("mid/other.cc:1: includes side/api.h") for p in found), found
    assert any(p.startswith("mid/bridge2.cc:1: includes side/internal.h") for p in found), found
    assert not any(p.startswith("mid/bridge.cc") for p in found), found


def test_library_code_may_not_include_testing(tmp_path: Path) -> None:
    found = problems(tmp_path, {"mid/lib.cc": '#include "testing/ranks.h"\n'})
    assert any(p.startswith("mid/lib.cc:1: includes testing/ranks.h") for p in found), found


def test_a_cycle_between_folders_fails(tmp_path: Path) -> None:
    # testing -> mid and mid -> testing (through a library file).
    found = problems(tmp_path, {"mid/lib.cc": '#include "testing/ranks.h"\n'})
    assert "include cycle between folders: mid -> testing -> mid" in found, found


def test_a_cycle_between_files_fails(tmp_path: Path) -> None:
    found = problems(tmp_path, {
        "top/x.h": header("top/x.h", '#include "top/y.h"'),
        "top/y.h": header("top/y.h", '#include "top/x.h"'),
    })
    assert ("include cycle between files (a .h/.cc pair is one unit): top/x -> top/y -> top/x"
            in found), found


def test_a_cycle_between_units_through_their_cc_files_fails(tmp_path: Path) -> None:
    # The old collectives/group_registry <-> process_group_tpu_dist loop: no
    # header includes the other, each .cc includes the other's header.
    found = problems(tmp_path, {
        "top/reg.h": header("top/reg.h"), "top/reg.cc": '#include "top/pg.h"\n',
        "top/pg.h": header("top/pg.h"), "top/pg.cc": '#include "top/reg.h"\n',
    })
    assert ("include cycle between files (a .h/.cc pair is one unit): top/pg -> top/reg -> top/pg"
            in found), found


def test_a_cycle_in_the_rules_fails(tmp_path: Path) -> None:
    root = make_tree(tmp_path, CLEAN)
    rules_path = root / "docs" / "layers.toml"
    rules_path.write_text(RULES.replace('path = "base"\nmay_include = []',
                                        'path = "base"\nmay_include = ["top"]'))
    found = check_layers.check(root, check_layers.load_rules(rules_path)).problems
    assert any("the rules form a cycle: base -> mid -> side -> top -> base" in p
               for p in found), found


def test_a_hardware_variable_read_outside_discovery_fails(tmp_path: Path) -> None:
    found = problems(tmp_path, {
        "mid/env.cc": 'const char* a = std::getenv("TPU_WORKER_ID");\n'
                      'auto b = tr::GetEnv(env, "MEGASCALE_COORDINATOR_ADDRESS");\n'
                      'auto c = getenv("TPU_DIST_BIND_ADDRESS");  // ours: allowed\n'
                      '// getenv("TPU_NAME") in a comment is no read\n',
        "py/user.py": ('import os\nh = os.environ["@WORKER_HOSTNAMES"]\n'
                       'if "@NAME" in os.environ:\n    pass\n'
                       'w = os.getenv("@WORKER_ID", "0")\n').replace("@", HW),
    })
    reads = sorted(p.split(": reads ")[0] + " " + p.split(": reads ")[1].split(":")[0]
                   for p in found if ": reads " in p)
    assert reads == ["mid/env.cc:1 TPU_WORKER_ID", "mid/env.cc:2 MEGASCALE_COORDINATOR_ADDRESS",
                     "py/user.py:2 TPU_WORKER_HOSTNAMES", "py/user.py:3 TPU_NAME",
                     "py/user.py:5 TPU_WORKER_ID"], found


@pytest.mark.parametrize("text", [
    "#ifndef MID_G_H_\n#define MID_G_H_\n#endif  // MID_G_H_\n",
    "#pragma once\nint x;\n",
    "#ifndef TPU_DIST_MID_G_H_\n#define TPU_DIST_MID_G_H_\n#endif\n",
])
def test_a_header_guard_other_than_tpu_dist_path_fails(tmp_path: Path, text: str) -> None:
    found = problems(tmp_path, {"mid/g.h": text})
    assert any(p.startswith("mid/g.h: header guard: expected") and "TPU_DIST_MID_G_H_" in p
               for p in found), found


def test_a_namespace_named_testing_fails(tmp_path: Path) -> None:
    found = problems(tmp_path, {
        "mid/t.cc": "namespace p::testing {\n}\nnamespace p {\nnamespace testing {\n}\n}\n"
                    "// namespace testing { in a comment\n",
    })
    named = [p for p in found if "namespace" in p]
    assert named == [
        "mid/t.cc:1: namespace p::testing: a namespace named testing shadows GoogleTest's "
        "(use test_support)",
        "mid/t.cc:4: namespace testing: a namespace named testing shadows GoogleTest's "
        "(use test_support)"], found


def test_a_folder_without_a_rule_fails(tmp_path: Path) -> None:
    found = problems(tmp_path, {"extra/z.cc": "int z;\n"})
    assert any(p.startswith("extra/z.cc: no rule for its folder") for p in found), found


def test_a_stale_doc_table_fails_and_write_fixes_it(tmp_path: Path) -> None:
    root = make_tree(tmp_path, CLEAN)
    doc = root / "docs" / "architecture.md"
    doc.write_text(doc.read_text().replace("the bottom", "the very bottom"))
    assert check_layers.main(["--root", str(root)]) == 1
    assert check_layers.main(["--root", str(root), "--write"]) == 0
    assert "the bottom |" in doc.read_text()
