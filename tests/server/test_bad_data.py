"""Bad data fails before any work (issue 8 §4): exit 2, one line naming the key, no traceback, no Ray.

Each case runs the real ``flower-simulation`` with Ray's temp dir pointed at a private folder: Ray creates
``<RAY_TMPDIR>/ray/session_*`` the moment it starts, so an empty folder proves it never did.
"""

import os
import shutil
import subprocess

import pytest
from simcli import BIN, sim_args

pytestmark = pytest.mark.e2e


def run_sim(args, ray_tmp, extra_env=None, timeout=120):
    env = {
        **os.environ,
        "FLWR_TELEMETRY_ENABLED": "0",
        "PYTHONUNBUFFERED": "1",
        "RAY_TMPDIR": str(ray_tmp),
        **(extra_env or {}),
    }
    env.pop("RAY_ADDRESS", None)
    return subprocess.run(
        [str(BIN / "flower-simulation"), *map(str, args)], capture_output=True, text=True, timeout=timeout, env=env
    )


def _unreadable(tmp_path, data):
    if os.geteuid() == 0:  # root reads any mode-000 file; this one fails with EIO on every read
        return "/proc/self/mem"
    path = tmp_path / "locked.tar.gz"
    shutil.copy(data["tarball"], path)
    path.chmod(0)
    return path


def _truncated(tmp_path, data):
    blob = data["tarball"].read_bytes()
    (tmp_path / "cut.tar.gz").write_bytes(blob[: len(blob) // 2])
    return tmp_path / "cut.tar.gz"


def _not_tar(tmp_path, data):
    (tmp_path / "notes.tar.gz").write_text("these are not images\n")
    return tmp_path / "notes.tar.gz"


def _empty_folder(tmp_path, data):
    (tmp_path / "empty").mkdir()
    return tmp_path / "empty"


def _no_splits(tmp_path, data):
    shutil.copytree(data["folder"] / "train", tmp_path / "flat" / "images")  # class folders, no train/ test/
    return tmp_path / "flat"


def _renamed_class(tmp_path, data):
    shutil.copytree(data["folder"], tmp_path / "renamed")
    (tmp_path / "renamed" / "test" / "cat").rename(tmp_path / "renamed" / "test" / "kitten")
    return tmp_path / "renamed"


@pytest.mark.parametrize(
    "make_root, words",
    [
        (_renamed_class, "test/kitten is no class of train/"),  # was a stack trace in the first round
        (_unreadable, "cannot read"),
        (_truncated, "truncated or corrupt"),
        (_not_tar, "neither a folder nor a tar archive"),
        (_empty_folder, "empty folder"),
        (_no_splits, "no train/<class>/<image> and test/<class>/<image>"),
    ],
)
def test_bad_data_root_exits_2_before_ray(tiny_data, tmp_path, make_root, words):
    root = make_root(tmp_path, tiny_data)
    ray_tmp = tmp_path / "ray-tmp"
    ray_tmp.mkdir()
    proc = run_sim(sim_args(tiny_data, tmp_path / "run", f"data.root={root}"), ray_tmp)
    _assert_one_line_exit_2(proc, "'data.root'", words, ray_tmp)
    assert str(root) in proc.stderr


def test_more_clients_than_examples_exits_2_before_ray(tiny_data, tmp_path):
    ray_tmp = tmp_path / "ray-tmp"
    ray_tmp.mkdir()
    # 120 training images: 200 clients cannot each get one (the cyclic groups themselves are valid)
    proc = run_sim(sim_args(tiny_data, tmp_path / "run", "num_clients=200"), ray_tmp)
    _assert_one_line_exit_2(proc, "'num_clients'", "more than the 120 training examples", ray_tmp)


def test_a_client_larger_than_the_machine_exits_2_before_ray(tiny_data, tmp_path):
    """Flower would build an empty actor pool and wait out every round's timeout."""
    ray_tmp = tmp_path / "ray-tmp"
    ray_tmp.mkdir()
    proc = run_sim(sim_args(tiny_data, tmp_path / "run", "backend.num_cpus=4096"), ray_tmp)
    _assert_one_line_exit_2(proc, "'backend.num_cpus'", "CPUs Ray gets here", ray_tmp)


def test_failed_download_is_one_line_before_ray(tiny_data, tmp_path):
    """torchvision's real download code, pointed at a proxy port where nothing listens (no network needed)."""
    ray_tmp = tmp_path / "ray-tmp"
    ray_tmp.mkdir()
    proxy = {"https_proxy": "http://127.0.0.1:9", "HTTPS_PROXY": "http://127.0.0.1:9", "no_proxy": ""}
    args = sim_args(tiny_data, tmp_path / "run", "data=cifar10", f"data.root={tmp_path / 'tv'}")
    args = [a for a in args if not a.startswith("data.root=") or "tv" in a]
    proc = run_sim(args, ray_tmp, proxy)
    _assert_one_line_exit_2(proc, "'data.download'", "could not download CIFAR-10", ray_tmp)


def _assert_one_line_exit_2(proc, key, words, ray_tmp):
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2, output[-3000:]
    assert "Traceback" not in output
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and key in lines[0] and words in lines[0], output[-3000:]
    assert not (ray_tmp / "ray").exists(), "Ray was started"


@pytest.mark.parametrize(
    "damage, words",
    [
        (lambda f: f.write_bytes(b"these are not pixels"), "cannot be decoded (UnidentifiedImageError"),
        (lambda f: f.write_bytes(f.read_bytes()[:200]), "cannot be decoded (Image is incomplete or truncated)"),
        (lambda f: _png(f, (64, 48)), "is 64x48 pixels, expected 32x32"),
    ],
)
def test_an_image_that_cannot_be_used_is_one_line_naming_it_before_ray(tiny_data, tmp_path, damage, words):
    """Found while the images are decoded (the cheap checks before it read names and headers only)."""
    root = tmp_path / "folder"
    shutil.copytree(tiny_data["folder"], root)
    image = sorted((root / "train").rglob("*.*"))[5]
    damage(image)
    ray_tmp = tmp_path / "ray-tmp"
    ray_tmp.mkdir()
    args = sim_args(tiny_data, tmp_path / "run", f"data.root={root}", f"data.cache_dir={tmp_path / 'cache'}")
    proc = run_sim(args, ray_tmp)
    _assert_one_line_exit_2(proc, "'data.root'", words, ray_tmp)
    assert image.relative_to(root).as_posix() in proc.stderr


def _png(path, size):
    from PIL import Image

    Image.new("RGB", size).save(path, format="PNG")
