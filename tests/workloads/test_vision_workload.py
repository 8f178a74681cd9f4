"""The vision workload: image loaders on files in their real formats (numpy
arrays, no framework), seeded augmentation, the numpy initial weights, the
ResNet at every size, and tiny reaching its target on digits."""

from __future__ import annotations

import io
import pickle

import numpy as np
import pytest
import torch
from PIL import Image
from pydantic import ValidationError

from ampcert.workloads import images, resnet, torch_models
from ampcert.workloads.base import DataError, Workload, warmup_cosine

WORKLOAD_PATH = "ampcert.workloads.resnet:WORKLOAD"


# ---------------------------------------------------------------- fixtures


def write_cifar_batch(path, n, seed, protocol=2, keys=(b"data", b"labels")):
    """A batch in the CIFAR-10 python format: a pickled dict with uint8 (n, 3072)
    data (R, G, B planes of 32x32) and a list of n labels."""
    rng = np.random.default_rng(seed)
    batch = {keys[0]: rng.integers(0, 256, (n, 3072), dtype=np.uint8),
             keys[1]: rng.integers(0, 10, n).tolist(),
             b"batch_label": b"testing batch"}
    path.write_bytes(pickle.dumps(batch, protocol=protocol))
    return batch


@pytest.fixture
def cifar_dir(tmp_path):
    root = tmp_path / "cifar-10-batches-py"
    root.mkdir()
    for i in range(1, 6):
        write_cifar_batch(root / f"data_batch_{i}", 8, seed=i)
    write_cifar_batch(root / "test_batch", 6, seed=9)
    names = [b"c%d" % i for i in range(10)]
    (root / "batches.meta").write_bytes(pickle.dumps({b"label_names": names}, protocol=2))
    return root


@pytest.fixture
def image_dir(tmp_path):
    """Three classes of tiny PNG/JPEG images, of different sizes and modes."""
    root = tmp_path / "imgs"
    rng = np.random.default_rng(0)
    for c, (name, n) in enumerate([("cat", 5), ("dog", 4), ("emu", 3)]):
        (root / name).mkdir(parents=True)
        for i in range(n):
            arr = rng.integers(0, 256, (10 + i, 12, 3), dtype=np.uint8)
            arr[..., c] = 255  # a class-coloured channel
            img = Image.fromarray(arr)
            if i == 1:
                img = img.convert("L")  # greyscale is converted to RGB
            img.save(root / name / f"{i}.{'jpg' if i == 2 else 'png'}")
        (root / name / "notes.txt").write_text("not an image")
    return root


def one_line_naming(exc: DataError, path) -> str:
    msg = str(exc)
    assert "\n" not in msg
    assert msg.startswith(f"{path}: "), msg
    return msg


# ---------------------------------------------------------------- CIFAR-10


def test_cifar_loader_reads_the_real_layout(cifar_dir):
    data = images.load_cifar10(cifar_dir)
    assert data.train_x.shape == (40, 3, 32, 32) and data.eval_x.shape == (6, 3, 32, 32)
    assert data.train_x.dtype == np.float32 and data.train_y.dtype == np.int64
    first = pickle.loads((cifar_dir / "data_batch_1").read_bytes())
    # Row 0 is R plane, then G, then B, each 32x32 row-major.
    raw = first[b"data"][0]
    assert data.train_x[0, 1, 2, 3] == pytest.approx(raw[1024 + 2 * 32 + 3] / 255)
    assert data.train_y[:8].tolist() == first[b"labels"]
    assert data.classes == [f"c{i}" for i in range(10)]
    info = data.info()
    assert info["n_train"] == 40 and info["source"] == "cifar10" and len(info["sha256"]) == 64
    assert images.load_cifar10(cifar_dir).info()["sha256"] == info["sha256"]  # deterministic
    small = images.load_cifar10(cifar_dir, max_train=10, max_eval=3)
    assert len(small.train_x) == 10 and len(small.eval_x) == 3
    assert np.array_equal(small.train_x, data.train_x[:10])
    images.check_cifar10(cifar_dir)


def test_cifar_accepts_python3_pickles(cifar_dir):
    write_cifar_batch(cifar_dir / "data_batch_3", 8, seed=3, protocol=5, keys=("data", "labels"))
    images.check_cifar10(cifar_dir)
    assert len(images.load_cifar10(cifar_dir).train_x) == 40


@pytest.mark.parametrize("damage, expect", [
    ("truncate", "truncated"),
    ("garbage", "unpickling failed"),
    ("wrong_keys", "needs keys 'data' and 'labels'"),
    ("wrong_shape", "shape (N, 3072)"),
    ("label_count", "'labels' has"),
    ("code", "refuses to unpickle global"),
])
def test_cifar_bad_batches_are_one_line_data_errors(cifar_dir, damage, expect):
    bad = cifar_dir / "data_batch_4"
    if damage == "truncate":
        bad.write_bytes(bad.read_bytes()[:5000])
    elif damage == "garbage":
        bad.write_bytes(b"this is not a pickle\n" * 10)
    elif damage == "wrong_keys":
        write_cifar_batch(bad, 8, seed=4, keys=(b"images", b"targets"))
    elif damage == "wrong_shape":
        bad.write_bytes(pickle.dumps({b"data": np.zeros((8, 1024), np.uint8), b"labels": [0] * 8}))
    elif damage == "label_count":
        bad.write_bytes(pickle.dumps({b"data": np.zeros((8, 3072), np.uint8), b"labels": [0] * 7}))
    elif damage == "code":
        bad.write_bytes(pickle.dumps({b"data": print, b"labels": []}))
    for fn in (images.check_cifar10, images.load_cifar10):
        with pytest.raises(DataError) as err:
            fn(cifar_dir)
        assert expect in one_line_naming(err.value, bad)


def test_cifar_missing_paths(tmp_path, cifar_dir):
    with pytest.raises(DataError) as err:
        images.check_cifar10(tmp_path / "nope")
    assert one_line_naming(err.value, tmp_path / "nope").endswith("does not exist")
    (cifar_dir / "test_batch").unlink()
    with pytest.raises(DataError) as err:
        images.load_cifar10(cifar_dir)
    one_line_naming(err.value, cifar_dir / "test_batch")


# ---------------------------------------------------------------- image folder


def test_image_folder_loads_sorted_classes_and_a_fixed_split(image_dir):
    data = images.load_image_folder(image_dir, image_size=16)
    assert data.classes == ["cat", "dog", "emu"]
    assert data.train_x.shape[1:] == (3, 16, 16) and data.train_x.dtype == np.float32
    assert len(data.train_x) + len(data.eval_x) == 12  # notes.txt is not an image
    assert sorted(set(data.eval_y.tolist())) == [0, 1, 2]  # stratified: every class in eval
    assert 0.0 <= data.train_x.min() and data.train_x.max() <= 1.0
    # The class-coloured channel is the brightest, so labels line up with pixels.
    xs, ys = np.concatenate([data.train_x, data.eval_x]), np.concatenate([data.train_y, data.eval_y])
    for x, y in zip(xs, ys, strict=True):
        if x.std(axis=0).mean() > 0.01:  # skip the greyscale ones
            assert x.mean(axis=(1, 2)).argmax() == y
    again = images.load_image_folder(image_dir, image_size=16)
    assert np.array_equal(again.train_x, data.train_x) and np.array_equal(again.eval_y, data.eval_y)
    assert data.info()["sha256"] == again.info()["sha256"]
    images.check_image_folder(image_dir)


def test_image_folder_failures(tmp_path, image_dir):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DataError) as err:
        images.check_image_folder(empty)
    assert "no class sub-folders" in one_line_naming(err.value, empty)

    (image_dir / "fox").mkdir()
    (image_dir / "fox" / "readme.md").write_text("x")
    for fn in (images.check_image_folder, images.load_image_folder):
        with pytest.raises(DataError) as err:
            fn(image_dir)
        assert "no images" in one_line_naming(err.value, image_dir / "fox")
    (image_dir / "fox" / "readme.md").unlink()
    (image_dir / "fox").rmdir()

    broken = image_dir / "dog" / "3.png"
    broken.write_bytes(b"\x89PNG\r\n\x1a\n not really\n a png")
    with pytest.raises(DataError) as err:
        images.load_image_folder(image_dir)
    assert "unreadable image" in one_line_naming(err.value, broken)

    with pytest.raises(DataError) as err:
        images.load_image_folder(tmp_path / "missing")
    one_line_naming(err.value, tmp_path / "missing")


# ---------------------------------------------------------------- the workload


def test_workload_meets_the_protocol_and_validates_params(cifar_dir):
    wl = resnet.WORKLOAD
    assert isinstance(wl, Workload) and wl.name == "resnet" and wl.higher_is_better
    p = wl.Params()
    assert (p.size, p.data, p.blocks, p.width, p.batch_size) == ("tiny", "digits", [1, 1], 16, 64)
    # Explicit params override the size's defaults; resolved params are explicit.
    q = wl.Params(size="base", width=32, optimizer="adamw")
    assert q.blocks == [2, 2, 2, 2] and q.width == 32 and q.lr == 2e-3
    assert wl.Params.model_validate(q.model_dump()) == q
    with pytest.raises(ValidationError, match="needs `path`"):
        wl.Params(data="cifar10")
    with pytest.raises(ValidationError, match="image_size"):
        wl.Params(image_size=64)
    with pytest.raises(ValidationError):
        wl.Params(colour="blue")
    b = wl.default_budget(p)
    assert (b.target, b.max_steps) == (0.93, 300)
    wl.check(p)
    wl.check(wl.Params(data="cifar10", path=str(cifar_dir)))
    with pytest.raises(DataError):
        wl.check(wl.Params(data="imagefolder", path=str(cifar_dir / "nope")))


def test_build_on_each_source(cifar_dir, image_dir):
    task = resnet.WORKLOAD.build(resnet.ResNetParams(), seed=0, device="cpu")
    assert task.train_x.shape == (1438, 1, 8, 8) and task.eval_x.shape == (359, 1, 8, 8)
    assert task.data_info["source"] == "digits" and task.data_info["n_train"] == 1438
    assert task.data_info["classes"] == [str(i) for i in range(10)]
    assert abs(task.train_x.mean()) < 1e-4  # normalised with train statistics
    for params, classes in [(dict(data="cifar10", path=str(cifar_dir), max_train=16), 10),
                            (dict(data="imagefolder", path=str(image_dir), image_size=16), 3)]:
        task = resnet.WORKLOAD.build(resnet.ResNetParams(**params), seed=0, device="cpu")
        assert len(task.data_info["sha256"]) == 64 and len(task.data_info["classes"]) == classes
        out = task.model(task.augment(task.train_x[:4], task.train_y[:4], 1)[0])
        assert out.shape == (4, classes)
        assert 0.0 <= task.evaluate(task.model.eval(), task.eval_x, task.eval_y) <= 1.0


def test_init_follows_the_seed_and_nothing_else():
    def weights(seed):
        return resnet.WORKLOAD.build(resnet.ResNetParams(), seed, "cpu").model.stem[0].weight

    first = weights(0)
    torch.manual_seed(99)  # neither torch's nor numpy's global generator plays a part
    np.random.seed(99)
    assert torch.equal(first, weights(0)) and not torch.equal(first, weights(1))


def test_initial_weights_follow_torchs_conventions():
    """He (fan_out) convolutions, torch's Linear default for the head, BatchNorm
    at 1/0 with the last of each block at 0, running statistics 0/1."""
    net = resnet.layout(resnet.ResNetParams(size="small"), 10, 3, 32)
    w = resnet.initial_weights(net, seed=0)
    conv = w.params["stages.2.conv2.weight"]  # (64, 64, 3, 3): fan_out 576
    assert conv.dtype == np.float32 and conv.std() == pytest.approx(np.sqrt(2 / 576), rel=0.05)
    assert abs(conv.mean()) < 0.005
    head = w.params["head.weight"]  # (10, 128): U(-1/sqrt(128), 1/sqrt(128))
    bound = 1 / np.sqrt(128)
    assert head.min() >= -bound and head.max() <= bound and head.max() > 0.8 * bound
    assert w.params["head.bias"].max() <= bound
    assert (w.params["stages.0.bn1.weight"] == 1).all() and (w.params["stages.0.bn2.weight"] == 0).all()
    assert (w.params["stem.1.bias"] == 0).all()
    assert (w.buffers["stem.1.running_mean"] == 0).all() and (w.buffers["stem.1.running_var"] == 1).all()
    # Each tensor has a stream of its own: a deeper net keeps the shared layers' values.
    deeper = resnet.initial_weights(resnet.layout(resnet.ResNetParams(size="small", blocks=[2, 2, 3]), 10, 3, 32), 0)
    assert np.array_equal(deeper.params["stages.2.conv2.weight"], conv)


def test_a_torch_model_that_disagrees_with_the_weights_is_refused():
    net = resnet.layout(resnet.ResNetParams(size="tiny"), 10, 1, 8)
    other = resnet.layout(resnet.ResNetParams(size="tiny", width=8), 10, 1, 8)
    with pytest.raises(ValueError, match="stem.0.weight is"):
        torch_models.load_weights(torch_models.ResNet(net), resnet.initial_weights(other, 0))
    weights = resnet.initial_weights(net, 0)
    del weights.params["head.bias"]
    with pytest.raises(ValueError, match=r"missing \['head.bias'\]"):
        torch_models.load_weights(torch_models.ResNet(net), weights)


def test_lr_schedule_warms_up_then_decays_to_a_tenth():
    f = warmup_cosine(10, 110)
    assert f(0) == pytest.approx(0.1) and f(9) == pytest.approx(1.0)
    assert f(60) == pytest.approx(0.55) and f(110) == pytest.approx(0.1) and f(500) == pytest.approx(0.1)
    assert all(f(s) >= f(s + 1) for s in range(10, 200))


@pytest.mark.parametrize("flip", [False, True])
def test_augment_is_a_function_of_seed_and_step(flip):
    x = np.arange(4 * 3 * 8 * 8, dtype=np.float32).reshape(4, 3, 8, 8)
    y = np.arange(4)
    aug = resnet.make_augment(seed=7, pad=2, flip=flip)
    state = np.random.get_state()[1].copy()
    a, ya = aug(x, y, 5)
    assert np.array_equal(np.random.get_state()[1], state)  # numpy's global generator untouched
    assert np.array_equal(a, aug(x, y, 5)[0]) and np.array_equal(ya, y)
    assert np.array_equal(a, resnet.make_augment(seed=7, pad=2, flip=flip)(x, y, 5)[0])
    assert not np.array_equal(a, aug(x, y, 6)[0])
    assert not np.array_equal(a, resnet.make_augment(seed=8, pad=2, flip=flip)(x, y, 5)[0])
    assert a.shape == x.shape and a.dtype == x.dtype
    # Each output is a shifted (and maybe mirrored) window of its own padded input.
    xp = np.pad(x, ((0, 0), (0, 0), (2, 2), (2, 2)))
    for i in range(4):
        windows = [xp[i, :, r:r + 8, c:c + 8] for r in range(5) for c in range(5)]
        windows += [w[..., ::-1] for w in windows] if flip else []
        assert any(np.array_equal(a[i], w) for w in windows)
    # The torch backend's version applies the same draws on the device: the same pixels.
    state = torch.get_rng_state()
    t, _ = torch_models.TorchCropFlip(aug)(torch.from_numpy(x), torch.from_numpy(y), 5)
    assert torch.equal(torch.get_rng_state(), state) and np.array_equal(t.numpy(), a)


@pytest.mark.parametrize("size, params, in_shape", [
    ("tiny", 19_706, (1, 8, 8)),
    ("small", 696_618, (3, 32, 32)),
    ("base", 11_173_962, (3, 32, 32)),
])
def test_model_sizes(size, params, in_shape):
    p = resnet.ResNetParams(size=size)
    model = resnet.build_model(p, 10, in_shape[0], in_shape[1])
    assert resnet.parameter_count(model) == params
    assert resnet.initial_weights(resnet.layout(p, 10, in_shape[0], in_shape[1]), 0).count() == params
    assert model(torch.randn(2, *in_shape)).shape == (2, 10)


def test_large_images_get_the_imagenet_stem():
    model = resnet.build_model(resnet.ResNetParams(size="tiny"), 5, 3, 96)
    assert model.stem[0].stride == (2, 2) and isinstance(model.stem[-1], torch.nn.MaxPool2d)
    assert model(torch.randn(1, 3, 96, 96)).shape == (1, 5)


def test_tiny_reaches_its_declared_target_on_digits_in_fp32():
    from ampcert import mllog
    from ampcert.backends import torch_backend
    from ampcert.spec import expand, parse_suite

    budget = resnet.WORKLOAD.default_budget(resnet.ResNetParams())
    suite = parse_suite({
        "name": "vision", "precisions": ["fp32"], "seeds": [0],
        "train": {"target": budget.target, "max_steps": budget.max_steps, "eval_every": budget.eval_every},
        "workloads": [{"workload": WORKLOAD_PATH, "params": {}}]})
    (spec,) = expand(suite, "cpu")
    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(1)  # two OpenMP threads on a shared 2-core box can be 10x slower
    try:
        result = torch_backend.train(spec, mllog.MLLogger(io.StringIO()))
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic)
    assert result.target_reached, result.evals
    assert result.steps_to_target <= 250
    assert result.data_info["source"] == "digits"
