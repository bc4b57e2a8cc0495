"""PT018 (GradScaler and fp16 autocast apart) and PT019 (accumulation without dividing)."""

from __future__ import annotations

from tests.check.snippets import flagged


def test_a_scaler_without_autocast_is_found() -> None:
    bad = """
    import torch
    scaler = torch.amp.GradScaler("cuda")
    for x, y in loader:
        loss = criterion(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    """
    assert flagged(bad, "PT018") == [6]


def test_fp16_autocast_without_a_scaler_is_found() -> None:
    bad = """
    import torch
    from torch.cuda.amp import autocast
    for x, y in loader:
        with torch.autocast("cuda", dtype=torch.float16):
            loss = criterion(model(x), y)
        with autocast():
            loss = loss + criterion(model(x), y)
        loss.backward()
    """
    assert flagged(bad, "PT018") == [5, 7]


def test_scaler_with_autocast_and_bf16_alone_are_fine() -> None:
    paired = """
    import torch
    scaler = torch.amp.GradScaler("cuda")
    for x, y in loader:
        with torch.autocast("cuda", dtype=torch.float16):
            loss = criterion(model(x), y)
        scaler.scale(loss).backward()
    """
    bf16 = """
    import torch
    for x, y in loader:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = criterion(model(x), y)
        loss.backward()
    """
    inference = """
    import torch
    with torch.autocast("cuda", dtype=torch.float16):
        out = model(x)
    """
    for good in (paired, bf16, inference):
        assert flagged(good, "PT018") == []


def test_accumulation_without_dividing_the_loss_is_found() -> None:
    bad = """
    accum = 4
    for i, (x, y) in enumerate(loader):
        loss = criterion(model(x), y)
        loss.backward()
        if (i + 1) % accum == 0:
            optimizer.step()
            optimizer.zero_grad()
    step = 0
    for batch in loader:
        model(batch).loss.backward()
        step += 1
        if step % 8 == 0:
            optimizer.step()
    """
    assert flagged(bad, "PT019") == [5, 11]


def test_divided_or_unaccumulated_losses_are_fine() -> None:
    good = """
    for i, (x, y) in enumerate(loader):
        loss = criterion(model(x), y)
        loss = loss / args.accum_steps
        loss.backward()
        if (i + 1) % args.accum_steps == 0:
            optimizer.step()
    for i, (x, y) in enumerate(loader):
        (criterion(model(x), y) / 4).backward()
        if i % 4 == 0:
            optimizer.step()
    for i, (x, y) in enumerate(loader):
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
        if i % 100 == 0:
            print(loss.item())
    """
    assert flagged(good, "PT019") == []


def test_a_division_of_something_else_by_the_count_does_not_hide_an_undivided_loss() -> None:
    """``len(loader) // accum`` sizes the scheduler; it does not divide the loss."""
    bad = """
    import torch
    steps = len(loader) // accum
    for i, (x, y) in enumerate(loader):
        loss = criterion(model(x), y)
        loss.backward()
        if (i + 1) % accum == 0:
            optimizer.step()
            optimizer.zero_grad()
    """
    assert flagged(bad, "PT019") == [6]
    assert flagged(bad.replace("loss.backward()", "(loss / accum).backward()"), "PT019") == []


def test_an_fp16_autocast_by_default_and_a_dtype_set_elsewhere_are_fp16() -> None:
    bad = """
    import torch
    amp_dtype = torch.float16
    for x, y in loader:
        with torch.autocast("cuda"):
            loss = criterion(model(x), y)
        with torch.autocast("cuda", dtype=amp_dtype):
            loss = criterion(model(x), y)
        loss.backward()
    """
    assert flagged(bad, "PT018") == [5, 7]
    assert (
        flagged(
            bad.replace("float16", "bfloat16").replace('"cuda")', '"cuda", dtype=amp_dtype)'),
            "PT018",
        )
        == []
    )


def test_a_gan_whose_generator_steps_every_n_batches_is_not_accumulation() -> None:
    """WGAN: the critic steps every batch, the generator every n_critic: nothing to divide."""
    code = """
    for i, (imgs, _) in enumerate(loader):
        optimizer_D.zero_grad()
        loss_D = critic(imgs).mean()
        loss_D.backward()
        optimizer_D.step()
        if i % n_critic == 0:
            optimizer_G.zero_grad()
            loss_G = -critic(gen(z)).mean()
            loss_G.backward()
            optimizer_G.step()
    """
    assert [flagged(code, r) for r in ("PT019", "PT022", "PT027")] == [[], [], []]
