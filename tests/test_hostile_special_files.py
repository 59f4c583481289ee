"""Special files are answered, never waited on (issue 14 item 6): a FIFO, /dev/zero, /dev/urandom, a
directory or a socket given as a dataset, job spec, profile, model config or bundle input gives a clear
error at once.  Each read runs in a thread under a timeout: a reader that blocks fails the test."""
from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from sessions.safe_files import SpecialFileError
from tests._hang_support import answered


@pytest.fixture
def specials(tmp_path: Path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    sock_path = tmp_path / "sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(sock_path))
    folder = tmp_path / "folder"
    folder.mkdir()
    yield {"FIFO": fifo, "/dev/zero": Path("/dev/zero"), "/dev/urandom": Path("/dev/urandom"),
           "directory": folder, "socket": sock_path}
    server.close()


def test_dataset_readers_refuse_special_files_at_once(specials) -> None:
    from sessions.extraction.datasets import count_lines, dataset_fingerprint, iter_dataset

    for kind, path in specials.items():
        for reader in (lambda p=path: list(iter_dataset(p)), lambda p=path: count_lines(p),
                       lambda p=path: dataset_fingerprint(p)):
            result = answered(reader)
            assert isinstance(result, OSError), (kind, result)
            assert str(path) in str(result), (kind, result)


def test_job_spec_and_its_dataset_check_refuse_special_files(specials, tmp_path: Path) -> None:
    from sessions.extraction.spec import check_paths, load_job_spec, parse_job_spec

    for kind, path in specials.items():
        result = answered(lambda p=path: load_job_spec(p))
        assert isinstance(result, SpecialFileError) or (kind == "directory" and isinstance(result, OSError)), \
            (kind, result)
        spec = parse_job_spec(f'[job]\nname = "t"\ndataset = "{path}"\noutput_dir = "{tmp_path / "out"}"\n'
                              f'server_url = "http://127.0.0.1:1"\nmodel_path = "{tmp_path}"\ncapture_dir = "{tmp_path / "cap"}"\n',
                              source="t.toml", base_dir=tmp_path)
        problems = answered(lambda s=spec: check_paths(s))
        assert any(p.field == "job.dataset" and "not a regular file" in p.message for p in problems), (kind, problems)


def test_profiles_and_model_configs_refuse_special_files(specials, tmp_path: Path) -> None:
    from sessions.profiles import ModelConfigError, ProfileError, load_profile, read_model_config

    for kind, path in specials.items():
        result = answered(lambda p=path: load_profile(p))
        assert isinstance(result, ProfileError), (kind, result)
        model = tmp_path / f"model-{kind.strip('/').replace('/', '-')}"
        model.mkdir()
        target = model / "config.json"
        if kind == "directory":
            target.mkdir()
        else:
            target.symlink_to(path)
        result = answered(lambda m=model: read_model_config(m))
        assert isinstance(result, ModelConfigError) and "not a regular file" in str(result), (kind, result)


def test_the_jobs_model_dims_and_state_files_refuse_a_fifo(specials, tmp_path: Path) -> None:
    from sessions.home import read_json

    result = answered(lambda: read_json(specials["FIFO"]))
    assert isinstance(result, SpecialFileError) and "FIFO" in str(result)
