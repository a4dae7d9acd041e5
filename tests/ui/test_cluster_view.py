"""The dashboard's cluster view: column headings over the lines, and no process keys without a
process table."""

from __future__ import annotations

from snapshot_apps.fake_dashboard import cluster_app, wait_for_frames

from hwdash.ui.widgets.monitor_cluster import HOST_WIDTH, ClusterHeading, ClusterTable


async def test_the_cluster_view_has_column_headings_aligned_with_its_lines() -> None:
    app = cluster_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for_frames(pilot, app, 1)
        heading = app.query_one(ClusterHeading)
        table = app.query_one(ClusterTable)
        assert heading.display and table.display
        head = "".join(segment.text for segment in heading.render_line(0))
        first = "".join(segment.text for segment in table.render_line(0))
        for title in ("host", "GPU", "full", "in use", "OOM", "util", "temp", "power"):
            assert title in head, title
        # Each reading sits under its heading: the line's last cell (power, "512 W") ends where
        # the heading's "power" ends, and the pressure cell ends under "full".
        assert first.rstrip().endswith("W")
        assert len(first.rstrip()) == len(head.rstrip())
        assert first.startswith("node-02")  # the host of the fullest GPU leads


async def test_the_cluster_view_offers_no_process_sort_or_detail() -> None:
    app = cluster_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for_frames(pilot, app, 1)
        await pilot.pause()
        offered = {active.binding.action for active in app.active_bindings.values()}
        assert "sort_processes" not in offered and "process_detail" not in offered
        assert "signal_process('TERM')" in offered or any(
            action.startswith("signal_process") for action in offered
        )  # k still answers, to say why it sends nothing


async def test_a_hosts_diagnoses_are_shown_under_its_gpu_and_fit_80_columns() -> None:
    app = cluster_app()
    async with app.run_test(size=(80, 48)) as pilot:  # 80 wide, tall enough for every line
        await wait_for_frames(pilot, app, 1)
        table = app.query_one(ClusterTable)
        lines = [
            "".join(segment.text for segment in table.render_line(y))
            for y in range(len(table.lines))
        ]
    # CLUSTER_DIAGNOSES: node-00's GPU 3 throttled; node-01's GPU 2 an Xid and ECC errors. Each
    # diagnosis line sits under its GPU's line (host cell blank: the host is the last one named).
    warned = {}
    host = ""
    for y, line in enumerate(lines):
        if line[:HOST_WIDTH].strip():
            host = line[:HOST_WIDTH].split()[0]
        if "⚠" in line:
            number = lines[y - 1][HOST_WIDTH + 1 : HOST_WIDTH + 3].strip()
            warned[(host, number)] = line.strip()
    assert set(warned) == {("node-00", "3"), ("node-01", "2")}
    throttled, xid = warned[("node-00", "3")], warned[("node-01", "2")]
    assert throttled.startswith("⚠ clocks throttled 42% of the last 60 s")
    assert xid.startswith("⚠ Xid 79: the GPU fell off the bus (+1 more)")  # the ECC one counted
    for line in lines:
        assert len(line) <= 80
    # Cut to the width with an ellipsis, the scroll bar's cells left free as on the GPU lines.
    assert throttled.endswith("…") and xid.endswith("…")
    assert all(line.endswith("    ") for line in lines if "⚠" in line)


async def test_ssh_hosts_show_in_the_cluster_view_with_names_as_text() -> None:
    """An SSH source (fed here without a connection): a GPU name in Rich markup is drawn as the
    text it is, and a host whose connection is gone is marked unreachable."""
    from snapshot_apps.fake_dashboard import shared_catalog

    from hwdash.telemetry.ssh_source import SshSampler
    from hwdash.ui.app import make_app

    sampler = SshSampler(["gpu-a", "gpu-b"], ssh=("ssh",), start=False, first_wait_s=0)
    for stream in sampler.streams.values():
        stream.connected = True
    sampler.streams["gpu-a"].feed("0, GPU-a0, [b]X[/], 100, 1000, 5, 40, 100")
    sampler.streams["gpu-b"].feed("0, GPU-b0, H100, 950, 1000, 5, 40, 100")
    sampler.streams["gpu-b"].connected = False
    app = make_app(
        catalog=shared_catalog(),
        sampler=sampler,
        interval=3600,
        initial_tab="monitor",
        alert_log=False,
        bell=False,
    )
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for_frames(pilot, app, 1)
            table = app.query_one(ClusterTable)
            lines = ["".join(s.text for s in table.render_line(y)) for y in range(2)]
            assert lines[0].startswith("gpu-b (unreacha")  # cut to the 16-cell host column
            assert lines[1].startswith("gpu-a") and "0 [b]X[/] " in lines[1]
    finally:
        sampler.close()
