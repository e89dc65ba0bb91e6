"""Progress files in shared directories (issue #22, "progress trust in shared directories",
daemon side): a file's owner is not the only one who can write it when the file is group- or
world-writable, or when a directory on its path (the configured root or any directory below
it) lets others rename or replace what it holds.  Such files are refused, never read; a sticky
directory (``/tmp``) is fine, for there only an entry's owner can rename it.
Runs as any user; the case of a directory owned by someone else needs root (to chown)."""
from __future__ import annotations

import json
import os

import pytest

from malletrain.daemon.files import Refused, open_as_owner
from malletrain.daemon.progress import ProgressTail

ME = os.getuid()



def good_lines():
    return "".join(json.dumps(dict(t=100.0 + i, samples=200.0 * i, nodes=2)) + "\n" for i in range(4))


def make(d, rel="7.jsonl", mode=0o644):
    path = os.path.join(d, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as fh:
        fh.write(good_lines())
    os.chmod(path, mode)
    return path


def refused(path, roots=("/tmp",)):
    try:
        os.close(open_as_owner(path, ME, roots))
    except Refused:
        tail = ProgressTail(roots=roots)
        assert tail.poll("7", path, uid=ME) == [] and tail.counters.refused == 1
        return True
    return False


@pytest.mark.parametrize("mode", [0o664, 0o646, 0o666, 0o620], ids=oct)
def test_a_file_others_can_write_is_refused(shared_dir, mode):
    assert refused(make(shared_dir, mode=mode))


@pytest.mark.parametrize("mode", [0o775, 0o757, 0o777, 0o2775], ids=oct)
def test_a_directory_others_can_write_is_refused(shared_dir, mode):
    path = make(shared_dir)
    os.chmod(shared_dir, mode)
    assert refused(path)


def test_any_directory_below_the_root_counts(shared_dir):
    path = make(shared_dir, "team/alice/metrics/7.jsonl")
    for d in ("team", "team/alice", "team/alice/metrics"):
        os.chmod(os.path.join(shared_dir, d), 0o755)
    assert not refused(path)
    os.chmod(os.path.join(shared_dir, "team"), 0o775)       # a teammate could rename alice/ away
    assert refused(path)


def test_the_root_itself_counts_unless_sticky(shared_dir):
    path = make(shared_dir, "sub/7.jsonl")
    os.chmod(os.path.join(shared_dir, "sub"), 0o755)
    os.chmod(shared_dir, 0o777)
    assert refused(path, roots=(shared_dir,))                # anyone may rename sub/ away
    os.chmod(shared_dir, 0o1777)                             # sticky, like /tmp: only sub/'s owner may
    assert not refused(path, roots=(shared_dir,))


def test_the_owners_file_in_a_sticky_world_writable_directory_is_read(shared_dir):
    path = make(shared_dir)
    os.chmod(shared_dir, 0o1777)
    tail = ProgressTail(roots=("/tmp",))
    assert len(tail.poll("7", path, uid=ME)) == 3


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a directory to another uid")
def test_a_directory_owned_by_someone_else_is_refused(shared_dir):
    path = make(shared_dir, "bob/7.jsonl")
    os.chown(os.path.join(shared_dir, "bob"), 4242, -1)      # 0755, but bob could replace the file
    uid = 4343                                               # the job's owner: neither bob nor root
    os.chown(path, uid, -1)
    with pytest.raises(Refused, match="owned by uid 4242"):
        os.close(open_as_owner(path, uid, ("/tmp",)))
