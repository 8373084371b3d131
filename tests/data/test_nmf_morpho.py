"""Morpho-MNIST-like attributes on drawn shapes with known thickness, slant, width and height."""
import math

import numpy as np

from inferlearn.experiments.morpho import binary_attributes, morpho_attributes


def _bar(width, shear=0.0):
    img = np.zeros((28, 28))
    for r in range(5, 23):
        c0 = int(round(12 + shear * (14 - r)))
        img[r, c0:c0 + width] = 1.0
    return img


def test_vertical_bars_thickness_width_height():
    """A 4-pixel bar has thickness 4, width 4 and height 18; guards against a medial-axis or
    distance-transform mistake (off by a factor 2, or measuring the whole area)."""
    a = morpho_attributes(np.stack([_bar(4), _bar(2)]))
    np.testing.assert_allclose(a["thickness"], [4.0, 2.0])
    np.testing.assert_allclose(a["height"], [18, 18])
    np.testing.assert_allclose(a["width"], [4, 2], atol=0.5)
    np.testing.assert_allclose(a["slant"], [0, 0], atol=1e-12)


def test_slant_sign_and_deslanted_width():
    """A bar whose top leans right has positive slant ≈ atan(shear), and its width after removing
    the slant stays the stroke width; guards against a sign flip (rows grow downwards)."""
    a = morpho_attributes(np.stack([_bar(3, 0.4), _bar(3, -0.4)]))
    assert a["slant"][0] > 0 > a["slant"][1]
    assert math.isclose(a["slant"][0], math.atan(0.4), abs_tol=0.05)
    assert a["width"][0] < 5


def test_median_split_uses_given_medians():
    """Test-set labels must use the training medians, not their own."""
    lab, med = binary_attributes({"t": np.array([1.0, 2.0, 3.0])})
    assert med == {"t": (2.0, False)} and lab["t"].tolist() == [0, 0, 1]
    lab2, _ = binary_attributes({"t": np.array([0.0, 2.5])}, med)
    assert lab2["t"].tolist() == [0, 1]


def test_median_split_with_ties_stays_balanced():
    """Heights of size-normalised digits tie at the median; the split must not put (almost) all
    samples in one class, which would make a probe's accuracy meaningless."""
    lab, med = binary_attributes({"h": np.array([18.0, 19.0, 20.0, 20.0, 20.0, 20.0, 20.0, 20.0])})
    assert med["h"] == (20.0, True)
    assert lab["h"].tolist() == [0, 0, 1, 1, 1, 1, 1, 1]
