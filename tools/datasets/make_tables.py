"""Writes the small real data sets shipped in data/tables/ from the copies that
scikit-learn bundles (no download):

* diabetes.csv: 442 patients, 10 raw features (age, sex, bmi, bp, s1..s6) and the
  disease progression one year later (`progression`, regression).
  Efron, Hastie, Johnstone, Tibshirani (2004), "Least Angle Regression".
* wine.csv: 178 wines, 13 chemical measurements and the cultivar (`cultivar`,
  0..2, classification). UCI Machine Learning Repository, Forina et al.
* digits.npz: 1797 handwritten digits, 8x8 greyscale scaled to [0, 1] (float16,
  exact), as the Keras layout x_train/y_train (first 1500) and x_test/y_test
  (last 297). UCI Optical Recognition of Handwritten Digits. Stored uncompressed
  (np.savez): Redline reads stored .npz members only.

    python3 -m venv ~/.venvs/redline-ref
    ~/.venvs/redline-ref/bin/pip install numpy scikit-learn
    ~/.venvs/redline-ref/bin/python tools/datasets/make_tables.py --out data/tables
"""

import argparse
import csv
import os

import numpy as np
from sklearn import datasets


def write_csv(path, names, x, y, yname, fmt):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(list(names) + [yname])
        for row, t in zip(x, y):
            w.writerow([fmt(v) for v in row] + [fmt(t)])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="data/tables")
    out = ap.parse_args().out
    os.makedirs(out, exist_ok=True)

    d = datasets.load_diabetes(scaled=False)
    write_csv(os.path.join(out, "diabetes.csv"), d.feature_names, d.data, d.target,
              "progression", lambda v: repr(float(v)).removesuffix(".0"))

    w = datasets.load_wine()
    write_csv(os.path.join(out, "wine.csv"), w.feature_names, w.data, w.target,
              "cultivar", lambda v: repr(float(v)).removesuffix(".0"))

    g = datasets.load_digits()
    x = (g.images / 16.0).astype(np.float16)[:, None, :, :]  # (N, 1, 8, 8)
    y = g.target.astype(np.int64)
    np.savez(os.path.join(out, "digits.npz"), x_train=x[:1500], y_train=y[:1500],
             x_test=x[1500:], y_test=y[1500:])
    for name in sorted(os.listdir(out)):
        print(name, os.path.getsize(os.path.join(out, name)), "bytes")


if __name__ == "__main__":
    main()
