"""The line a tables CSV's error names is the line the table is on. Rows had been counted from 2
by their place among the records, so a blank line (a spreadsheet's, or one between groups of
tables) or a name with a quoted line break moved every later message up: a bad value on line 5
was reported on line 3, and a repeated name on lines 4 and 5 on lines 3 and 4."""
import pytest

from kit.errors import KitError
from kit.sharding import read_tables


@pytest.mark.parametrize("text, where", [
    ("name,rows,dim,pooling\n\na,1000,16,1\n\nb,x,16,1\n", "line 5: rows"),
    ("name,rows,dim,pooling\r\n\r\na,10,16,1\r\n\"b\r\nc\",x,16,1\r\n", "line 4: rows"),
    ("name,rows,dim,pooling\n\"a\nb\",1000,16,1\nc,1000,16,1\nc,10,16,1\n",
     r"line 5: table name 'c' appears twice \(first at \S+ line 4\)"),
    ("name,rows,dim,pooling\n\n\na,1,2,1,9\n", "line 4: more fields"),
    ("name,rows,dim,pooling\na,10,16,1\nb,10,16,1\n,10,16,1\n", "line 4: name is empty"),
])
def test_the_message_names_the_tables_own_line(tmp_path, text, where):
    path = tmp_path / "t.csv"
    path.write_bytes(text.encode())
    with pytest.raises(KitError, match=where):
        read_tables(path)


def test_blank_lines_lose_no_table(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("name,rows,dim,pooling\n\na,1000,16,1\n\n\nb,20,8,2\n\n")
    assert [(t.name, t.rows, t.pooling) for t in read_tables(path)] == [("a", 1000, 1), ("b", 20, 2)]


@pytest.mark.parametrize("rows, dim", [("1000.0000000000000001", "16"), ("1000", "16.000000000000001")])
def test_a_size_a_hair_off_whole_is_refused(tmp_path, rows, dim):
    # through float() both had been read as whole (1000 rows, dim 16): the nearest double is
    path = tmp_path / "t.csv"
    path.write_text(f"name,rows,dim,pooling\na,{rows},{dim},1\n")
    with pytest.raises(KitError, match="line 2: (rows|dim) must be a whole number"):
        read_tables(path)


def test_whole_sizes_are_read_exactly(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("name,rows,dim,pooling\na,1e6,16.0,1\nb,1000003,8,2\n")
    assert [(t.rows, t.dim) for t in read_tables(path)] == [(10**6, 16), (1000003, 8)]
