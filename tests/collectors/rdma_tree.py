"""Fixture sysfs trees for the rdma source, written from the kernel's ABI (Documentation/ABI/stable/
sysfs-class-infiniband): these are fixtures, not a real HCA's files. `root` stands for /sys."""

from __future__ import annotations

import shutil
from pathlib import Path

# What an mlx5 ConnectX port shows on a healthy EDR link (names per the ABI, values made up)
COUNTERS = {"port_xmit_data": 1_000, "port_rcv_data": 2_000, "port_xmit_packets": 10, "port_rcv_packets": 20,
            "symbol_error": 0, "link_error_recovery": 0, "link_downed": 0, "port_rcv_errors": 0,
            "excessive_buffer_overrun_errors": 0, "port_xmit_discards": 0, "port_xmit_wait": 0}
HW_COUNTERS = {"np_cnp_sent": 0, "rp_cnp_handled": 0, "out_of_sequence": 0, "packet_seq_err": 0,
               "local_ack_timeout_err": 0}


class RdmaTree:
    def __init__(self, root: Path):
        self.root = root
        self.base = root / "class" / "infiniband"
        self.base.mkdir(parents=True, exist_ok=True)

    def port_dir(self, device: str, port: int) -> Path:
        return self.base / device / "ports" / str(port)

    def add_port(self, device: str = "mlx5_0", port: int = 1, *, state: str = "4: ACTIVE",
                 phys_state: str = "5: LinkUp", rate: str = "100 Gb/sec (4X EDR)", link_layer: str = "InfiniBand",
                 counters: dict[str, int | str] | None = None,
                 hw_counters: dict[str, int | str] | None = None) -> Path:
        d = self.port_dir(device, port)
        (d / "counters").mkdir(parents=True, exist_ok=True)
        for name, text in (("state", state), ("phys_state", phys_state), ("rate", rate), ("link_layer", link_layer)):
            (d / name).write_text(text + "\n")
        for name, value in (COUNTERS if counters is None else counters).items():
            self.set_counter(device, port, name, value)
        if hw_counters is not None:
            (d / "hw_counters").mkdir(exist_ok=True)
            for name, value in hw_counters.items():
                self.set_counter(device, port, name, value, hw=True)
        return d

    def set_counter(self, device: str, port: int, name: str, value: int | str, *, hw: bool = False) -> None:
        (self.port_dir(device, port) / ("hw_counters" if hw else "counters") / name).write_text(f"{value}\n")

    def set_state(self, device: str, port: int, state: str, phys_state: str | None = None) -> None:
        d = self.port_dir(device, port)
        (d / "state").write_text(state + "\n")
        if phys_state is not None:
            (d / "phys_state").write_text(phys_state + "\n")

    def write(self, device: str, port: int, relative: str, text: str) -> Path:
        path = self.port_dir(device, port) / relative
        path.write_text(text)
        return path

    def remove_device(self, device: str) -> None:
        shutil.rmtree(self.base / device)
