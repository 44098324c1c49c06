#!/usr/bin/env python3
"""Rebuilds configs/data/digits/{train,val}/ from real data in Debian packages.

    scripts/make-digits-dataset.py [OUT_DIR]      # default: configs/data/digits

Needs python3-sklearn, python3-numpy and espeak-ng (Debian 12). The output
is deterministic: the same packages give the same bytes (the script prints
each file's SHA-256; configs/data/digits/README.md lists them).

Every sample is one handwritten digit of scikit-learn's digits data (UCI
optdigits: 1797 8x8 images, pixel values 0..16, about 180 per class), paired
with the digit's name spoken by espeak-ng and written as characters:

  img.npy          uint8   [S, 16, 4]   the 8x8 image as 16 patches of 2x2
                                        pixels (row-major patches, each
                                        row-major), value * 255 / 16, rounded
  aud.npy          float16 [S, 32, 16]  the spoken name: a 16-band log power
                                        spectrogram over 32 frames, cut into
                                        32 patches of 4 bands x 4 frames
                                        (frame-major), standardised per clip
  txt.npy          int32   [S, 8]       the name's letters a..z as 1..26,
                                        then 27 (end), then 0 (padding)
  llm.targets.npy  int64   [S, 24]      targets of the captioning task
                                        (16 image positions, then the 8
                                        letters): position p predicts token
                                        p + 1 of the text; -1 (ignored) at
                                        the image positions before the last
                                        and after the end token
  labels.npy       int32   [S]          the digit 0..9

Split: the first 1500 images train, the other 297 validate. The voices
differ too: training clips use voice settings 0..19 of each digit, the
validation clips settings 20..23 (other accents, speeds and pitches), so
validation accuracy measures generalisation to unseen speakers and writers.
"""
import hashlib
import io
import os
import subprocess
import sys
import wave

import numpy as np
from sklearn.datasets import load_digits

NAMES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
VOICES = ["en-gb", "en-us", "en-gb-scotland", "en-gb-x-rp", "en-029", "en-gb-x-gbclan"]
VARIANTS = ["m1", "m2", "m3", "m4", "f1", "f2", "f3", "f4"]
SETTINGS = 24       # voice settings per digit; 0..19 train, 20..23 validation
TRAIN = 1500        # first TRAIN images train
BANDS, FRAMES = 16, 32
TEXT = 8
END, PAD = 27, 0


def setting(digit, k):
    """Voice setting k of a digit: language, variant, speed (wpm), pitch (0-99)."""
    i = digit * SETTINGS + k
    return (VOICES[(i * 5) % len(VOICES)], VARIANTS[(i * 3 + k) % len(VARIANTS)],
            120 + (i * 37) % 80, 25 + (i * 53) % 50)


def speak(word, voice, variant, speed, pitch):
    """espeak-ng's 22050 Hz mono 16-bit samples of `word`, as float in [-1, 1)."""
    wav = subprocess.run(["espeak-ng", "--stdout", "-v", f"{voice}+{variant}", "-s", str(speed),
                          "-p", str(pitch), word], check=True, capture_output=True).stdout
    with wave.open(io.BytesIO(wav)) as w:
        rate = w.getframerate()
        x = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2").astype(np.float64) / 32768.0
    return x, rate


def spectrogram(x, rate):
    """[BANDS, FRAMES] standardised log power in log-spaced bands 100 Hz - 8 kHz."""
    loud = np.flatnonzero(np.abs(x) > 0.02)  # trim the silence around the word
    x = x[loud[0]:loud[-1] + 1]
    n, hop = 512, 128
    x = np.pad(x, (0, max(0, n - len(x))))
    frames = 1 + (len(x) - n) // hop
    win = np.hanning(n)
    spec = np.abs(np.fft.rfft(np.stack([x[i * hop:i * hop + n] * win for i in range(frames)]), axis=1)) ** 2
    freqs = np.fft.rfftfreq(n, 1.0 / rate)
    edges = np.geomspace(100.0, 8000.0, BANDS + 1)
    bands = np.stack([spec[:, (freqs >= lo) & (freqs < hi)].sum(axis=1) for lo, hi in zip(edges[:-1], edges[1:])],
                     axis=0)  # [BANDS, frames]
    logp = np.log(bands + 1e-8)
    t = np.linspace(0, frames - 1, FRAMES)
    res = np.stack([np.interp(t, np.arange(frames), row) for row in logp])  # [BANDS, FRAMES]
    return (res - res.mean()) / (res.std() + 1e-6)


def patches(a, ph, pw):
    """[H, W] -> [(H/ph) (W/pw), ph pw]: row-major patches, each row-major."""
    h, w = a.shape
    return a.reshape(h // ph, ph, w // pw, pw).transpose(0, 2, 1, 3).reshape(-1, ph * pw)


def text_tokens(digit):
    ids = [ord(c) - ord("a") + 1 for c in NAMES[digit]] + [END]
    return ids + [PAD] * (TEXT - len(ids))


def caption_targets(tokens):
    """Prefix-LM targets over 16 image + 8 text positions."""
    t = [-1] * 15 + [tokens[0]]  # the last image position predicts the first letter
    for i in range(TEXT):
        nxt = tokens[i + 1] if i + 1 < TEXT else PAD
        t.append(nxt if tokens[i] != END and tokens[i] != PAD else -1)
    return t


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "configs", "data",
                                                             "digits")
    digits = load_digits()
    images, labels = digits.images.astype(np.float64), digits.target.astype(np.int64)
    clips = {}
    for d in range(10):
        for k in range(SETTINGS):
            x, rate = speak(NAMES[d], *setting(d, k))
            clips[d, k] = patches(spectrogram(x, rate), 4, 4).reshape(FRAMES // 4 * BANDS // 4, 16)
    # A clip per sample: training samples cycle through settings 0..19 of
    # their digit, validation samples through 20..23.
    count = np.zeros((10,), dtype=np.int64)
    splits = {"train": range(0, TRAIN), "val": range(TRAIN, len(images))}
    for split, rows in splits.items():
        img, aud, txt, tgt, lab = [], [], [], [], []
        for i in rows:
            d = int(labels[i])
            k = int(count[d] % 20) if split == "train" else 20 + int(count[d] % 4)
            count[d] += 1
            img.append(patches(np.rint(images[i] * 255.0 / 16.0), 2, 2))
            aud.append(clips[d, k])
            tok = text_tokens(d)
            txt.append(tok)
            tgt.append(caption_targets(tok))
            lab.append(d)
        folder = os.path.join(out, split)
        os.makedirs(folder, exist_ok=True)
        arrays = {"img": np.array(img, dtype=np.uint8), "aud": np.array(aud, dtype=np.float16),
                  "txt": np.array(txt, dtype=np.int32), "llm.targets": np.array(tgt, dtype=np.int64),
                  "labels": np.array(lab, dtype=np.int32)}
        for name, a in arrays.items():
            path = os.path.join(folder, name + ".npy")
            np.save(path, np.ascontiguousarray(a))
            with open(path, "rb") as f:
                digest = hashlib.sha256(f.read()).hexdigest()
            print(f"{split}/{name}.npy {a.dtype} {list(a.shape)} sha256 {digest}")


if __name__ == "__main__":
    main()
