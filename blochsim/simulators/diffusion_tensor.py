"""The diffusion tensor's six components: their public names and order.

`TENSOR = ("Dxx", "Dyy", "Dzz", "Dxy", "Dxz", "Dyz")`: the three diagonal entries, then the three
off-diagonal ones in row-major order of the upper triangle. Each is a tissue property in um^2/ms. The
tensor is symmetric,

    D = [[Dxx, Dxy, Dxz],
         [Dxy, Dyy, Dyz],
         [Dxz, Dyz, Dzz]],

and a unit gradient direction g = (gx, gy, gz) sees the apparent diffusivity

    g^T D g = gx^2 Dxx + gy^2 Dyy + gz^2 Dzz + 2 gx gy Dxy + 2 gx gz Dxz + 2 gy gz Dyz.

This is MRtrix's `dwi2tensor` order (diagonal first); FSL's `dtifit` stores the upper triangle row by row
instead (xx, xy, xz, yy, yz, zz), so reorder when reading its output.
"""

from __future__ import annotations

__all__ = ["DIAGONAL", "OFF_DIAGONAL", "TENSOR", "INDEX"]

#: The six component names, in order.
TENSOR: tuple[str, ...] = ("Dxx", "Dyy", "Dzz", "Dxy", "Dxz", "Dyz")

DIAGONAL: tuple[str, ...] = TENSOR[:3]
OFF_DIAGONAL: tuple[str, ...] = TENSOR[3:]

#: (row, column) of each component in the 3x3 tensor (its upper-triangle position).
INDEX: dict[str, tuple[int, int]] = {
    "Dxx": (0, 0),
    "Dyy": (1, 1),
    "Dzz": (2, 2),
    "Dxy": (0, 1),
    "Dxz": (0, 2),
    "Dyz": (1, 2),
}
