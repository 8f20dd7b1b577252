"""docs/collectives.md's c10d support table is the tests' table (issue 38 item 5).

The source is docs/c10d_support.tsv; tools/c10d_support_table.py renders it
into the docs and checks it (see its docstring). These tests fail when the
docs' table is edited by hand or falls behind the source, when torch's
c10d::Backend / ProcessGroup gain a virtual with no row, when a "supported"
row names no test or a test that does not exist, is skipped, is not run by
CI or is an expected failure, and when a Backend row contradicts the
overrides of ProcessGroupTpuDist or ProcessGroupGloo. The rest of the file
checks that the checker catches each of those.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import c10d_support_table as table  # noqa: E402

HEADER = "\t".join(table.COLUMNS)


def test_docs_table_is_generated_from_the_source() -> None:
    rows, problems = table.load()
    assert not problems, problems
    assert table.doc_problems(rows) == []


def test_source_agrees_with_torch_headers_and_tests() -> None:
    assert table.problems() == []


def test_every_supported_row_names_a_test() -> None:
    rows, _ = table.load()
    assert rows
    assert all(r.tests for r in rows if r.status == "supported")


def _source(tmp_path: Path, *rows: str) -> Path:
    p = tmp_path / "t.tsv"
    p.write_text("# comment\n" + HEADER + "\n" + "\n".join(rows) + "\n")
    return p


def _row_problems(tmp_path: Path, *rows: str) -> list[str]:
    parsed, problems = table.load(_source(tmp_path, *rows))
    return problems + table.test_problems(parsed) + table.header_problems(parsed)


def test_checker_catches_a_missing_test(tmp_path: Path) -> None:
    found = _row_problems(tmp_path, "Backend::barrier\tbarrier\tsupported\tyes\t"
                          "py:tests/python/test_backend.py::test_no_such_test\t")
    assert any("has no test function test_no_such_test" in p for p in found), found
    found = _row_problems(tmp_path, "Backend::barrier\tbarrier\tsupported\tyes\t\t")
    assert any("names no test" in p for p in found), found


def test_checker_catches_a_suite_test_outside_ci_or_expected_to_fail(tmp_path: Path) -> None:
    found = _row_problems(tmp_path, "Backend::recvAnysource\trecv\tsupported\tyes\t"
                          "suite:test_send_recv_any_source suite:test_all_reduce_sum_cuda\t")
    assert any("expected failure" in p for p in found), found
    assert any("test_all_reduce_sum_cuda: not in the torch suite's CI selection" in p
               for p in found), found


def test_checker_catches_a_missing_gtest(tmp_path: Path) -> None:
    found = _row_problems(tmp_path, "Backend::abort\tx\tsupported\tyes\t"
                          "cc:collectives/abort_test.cc:AbortTest.NoSuchTest\t")
    assert any("no TEST*(AbortTest, NoSuchTest)" in p for p in found), found


def test_checker_catches_rows_that_contradict_the_headers(tmp_path: Path) -> None:
    found = _row_problems(
        tmp_path,
        # tpu_dist does not override recvAnysource: it cannot be 'supported'.
        "Backend::recvAnysource\trecv\tsupported\tyes\tsuite:test_send_recv\t",
        # Gloo overrides allreduce_sparse: the gloo column must say so.
        "Backend::allreduce_sparse\tall_reduce\tnot\tno\t\tdense only",
        # both override broadcast: it is not c10d's default.
        "Backend::broadcast\tbroadcast\tinherited\tsame\t\t",
        "Backend::no_such_virtual\tx\tnot\tno\t\tnothing",
    )
    text = "\n".join(found)
    assert "Backend::recvAnysource is 'supported' but" in text
    assert "Backend::allreduce_sparse: gloo column 'no'" in text
    assert "Backend::broadcast is 'inherited' but tpu_dist overrides it" in text
    assert "Backend::no_such_virtual is not a virtual" in text
    # ... and every virtual without a row is named.
    assert "torch 2.15's Backend::allreduce has no row" in text


def test_checker_catches_a_hand_edited_docs_table(tmp_path: Path) -> None:
    rows, _ = table.load()
    doc = tmp_path / "collectives.md"
    text = table.DOC.read_text()
    doc.write_text(text.replace("| not supported |", "| supported |", 1))
    assert table.doc_problems(rows, doc) != []
    doc.write_text(text.replace(table.BEGIN, ""))
    assert "no generated table" in table.doc_problems(rows, doc)[0]
    doc.write_text(table.with_table(text, table.render(rows)))
    assert table.doc_problems(rows, doc) == []


@pytest.mark.parametrize("bad", ["x\ty\tmaybe\tyes\t\t", "x\ty\tnot\tyes\t", "x\ty\tdiffers\tyes\t\t"])
def test_checker_catches_malformed_rows(tmp_path: Path, bad: str) -> None:
    rows, problems = table.load(_source(tmp_path, bad))
    if not problems:
        src = _source(tmp_path, bad)
        problems = table.problems(src)
    assert problems
