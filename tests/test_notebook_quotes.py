"""The numbers notebooks 00-09 quote, kept true here rather than by asserts in the notebooks (issue 45: a student
reads the asserts that carry a verdict; the pins of printed numbers live in this test).

Each row names a cell whose output nbval compares (no NBVAL_IGNORE_OUTPUT), a fragment that cell prints, and the
fragment of the notebook's text that quotes it: re-executing a notebook after a change that moves a quoted number
fails here until the text follows. The notebooks also end with a five-line summary, and the technique notebooks'
"When would you use it?" boxes say only what applies and end in a decision rule (01-04: with the numbers of the
course's own measurements, quoted from the cell that computes them)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NB = {p.name[:2]: p for p in (ROOT / "notebooks").glob("0[0-9]_*.ipynb")}
BOXES = ["01", "02", "03", "04", "05", "06", "07", "08"]                  # the technique notebooks with their "When would you use it?" box
SUMMARIES = ["00", "01", "02", "03", "04", "05", "06", "07", "08", "09"]

# notebook -> [(cell id, printed fragment, the text's fragment or None)]
QUOTES = {
    "00": [
        ('gaps-lrflops', 'dense-L6-d32 at 0.0025 - the same at 0.01: +0.069 [+0.029, +0.109] (n=5): loses',
         '(0.01: +0.069 [+0.029, +0.109],\n  paired, loses)'),
        ('gaps-lrflops', 'at 0.005 -0.121 [-0.146, -0.095] (n=5): wins',
         '(−0.121 [−0.146, −0.095], wins; −0.212 at 0.02)'),
        ('gaps-lrflops', 'at 0.02 -0.212 [-0.270, -0.155] (n=5): wins',
         None),
        ('gaps-lrflops', 'multilevel      -0.017 n.r.          -0.006 [-0.020, +0.008] n.r.',
         '(−0.006 [−0.020, +0.008] at 0.005)'),
        ('gaps-lrflops', 'final losses within 0.0029 per seed',
         'final losses within 0.003 per seed'),
        ('gaps-lrcheck', '0.0025    2.084 ± 0.018          +0.004 [-0.013, +0.020]',
         '(0.0025 is within 0.004 nats'),
        ('gaps-aaec150a', "the baseline reads 849 tokens per parameter, 10.0x the optimum's", 'with the baseline\nreading about ten times its tokens per parameter'),
        ("4afe3cfe", " unigram: 3.3222 nats on the eval windows | whole split 3.3289 nats = 4.8026 bits/byte", None),
        ("4afe3cfe", "  bigram: 2.5484 nats on the eval windows | whole split 2.5444 nats = 3.6708 bits/byte", None),
        ("a974109a", "chosen vs bigram (2.5484): -0.2155 nats", "the tuned baseline ends 0.22 nats below the bigram line"),
        ("fa499e33", "tutorial budget: baseline 337,024 parameters (all), 614,400 tokens: 1.8 tokens per parameter",
         "the tutorial baseline reads 1.8 tokens per parameter"),
        ("fa499e33", "50 tokens/param: baseline 57,264 parameters (all), 2,867,200 tokens: 50.1 tokens per parameter (2.5x", "Its 50 tokens per parameter\nare 2.5× Hoffmann et al.'s ~20"),
        ("6a5ba129", "its optimum reads 129 tokens per parameter [105, 160] (per seed 106-168); the 6-block baseline is 1.5x the optimal size",
         "optimum at about 129 tokens per parameter and the\n6-block baseline at about 1.5× the optimal size"),
        ("32296128", "N_opt ∝ C^a: a = 0.55 [0.42, 0.68] (2 residual df)", "a = 0.55 [0.42, 0.68]"),
        ("32296128", "D_opt ∝ C^b: b = 0.41 [0.28, 0.55] (2 residual df)", "b = 0.41 [0.28, 0.55]"),
        ("32296128", "4x64@80   1.21e+11    21,848  1,203,893   2.077  55 [30, 102] (n=3)", "is 39–55 tokens per parameter, not ~20"),
        ("32296128", "12x64     1.30e+12    80,686  3,183,878   1.796  39 [21, 73] (n=3)", None),
        ("32296128", "approach 3 on 23 points (5 parameters): E = 1.53, alpha = 0.66, beta = 0.78, a = beta/(alpha+beta) = 0.54; RMS residual 0.085 nats",
         "the 23 points of the profiles) gives a similar a = 0.54, but it fits\n  poorly: its RMS residual is 0.085 nats"),
        ("69d19297", "tutorial baseline: C = 1.33e+12, N = 337,024 (4.3x the fitted N_opt there), D/N = 1.8", "The tutorial baseline is 4.3× the compute-optimal size"),
        ("69d19297", "6 x 24 baseline (50 tokens/param): C = 1.14e+12, N = 57,264 (0.8x the fitted N_opt there), D/N = 50.1", "is 0.8× the one-block grid's optimal size"),
        ("a11549a0", "12x64     width  64: 0.5x LR +0.023 [-0.013, +0.059] (n=3): not resolved at 3 seeds; 2x LR -0.017 [-0.047, +0.014]",
         "2× is 0.017 nats better in the mean"),
        ("a11549a0", "its tuned LR 0.02857 is 1.53x the rule's", "is 1.53× the rule's"),
    ],
    "01": [
        ('nb01-rule', "FLOPs to the baseline's final loss: 0/5 reached (not within 1.00x)",
         "no seed reaches the baseline's loss within its FLOPs"),
        ('nb01-rule', 'PLD - same-size baseline at equal FLOPs: +0.066 [+0.048, +0.085] (n=5): loses',
         'PLD loses:\n> +0.066 [+0.048, +0.085] against the same-size baseline'),
        ('nb01-rule', 'PLD - dense frontier (dense-L6-d32): +0.187',
         'frontier (+0.187)'),
        ('nb01-rule', '(ot_flops): PLD - same-size baseline +0.052 [-0.003, +0.107] (n=5): not resolved',
         'its gap was +0.052 [−0.003, +0.107]: not\n> resolved'),
        ("cell-18", "live PLD run: 4.3300 blocks per micro-batch", "it ran 4.33 of 6 blocks per micro-batch"),
        ("cell-18", "FLOPs of the PLD run: 0.734 x the baseline's", "and 0.73× the baseline's FLOPs at equal steps"),
        ("cell-29", "pld              step time   57.0 ms  ratio 0.747", "a step took 0.75× the baseline's on one CPU core"),
        ("pr-09", "FLOPs to the baseline's final loss      tutorial budget  1/5 reached: 0.93x; 4 not within 1.00x; sign test 1 below, 4 above (p=0.38)",
         "1/5 seeds reached (0.93x); sign test 1 below, 4 above"),
        ("pr-09", "50 tokens/param  0/5 reached (not within 1.00x); sign test 0 below, 5 above (p=0.062)",
         "0/5 seeds reached within 1.00x; sign test 0 below, 5 above (p = 0.062)"),
        ("pr-09", "tutorial budget  +0.033 [-0.008, +0.074] (n=5): not resolved at 5 seeds", "+0.033 [−0.008, +0.074]: not resolved at 5 seeds"),
        ("pr-09", "50 tokens/param  +0.086 [+0.071, +0.101] (n=5): loses", "+0.086 [+0.071, +0.101]: **loses**"),
        ("pr-09", "tutorial budget  +0.564 [+0.506, +0.622] (n=5): loses", "+0.564 [+0.506, +0.622]: **loses**"),
        ("pr-09", "50 tokens/param  +0.110 [+0.093, +0.128] (n=5): loses", "+0.110 [+0.093, +0.128]: **loses**"),
        ("pr-09", "tutorial budget  +0.152 [+0.121, +0.183] (n=3): loses", "+0.152 [+0.121, +0.183], 3 seeds: **loses**"),
        ("nb01-rule", "long_short     6 x 24  at  1.8 tokens per parameter: PLD - same-size baseline -0.122 [-0.280, +0.036] (n=5): not resolved",
         "same 1.8 tokens per parameter (−0.122 [−0.280, +0.036], not resolved"),
        ("nb01-rule", "tutorial_flops 6 x 64  at  1.8 tokens per parameter: PLD - same-size baseline +0.033 [-0.008, +0.074] (n=5): not resolved",
         "(6 × 64 at 1.8 tokens per parameter: +0.033, not resolved)"),
        ("nb01-rule", "long_flops     6 x 24  at 50.1 tokens per parameter: PLD - same-size baseline +0.086 [+0.071, +0.101] (n=5): loses",
         "parameter it loses (+0.086)"),
        ("nb01-rule", "the gap moves +0.018 [-0.029, +0.064] per tenfold N (3 df): flat within noise; PLD wins at 0 of 6 sizes",
         "+0.018 [−0.029, +0.064] per tenfold N, flat within noise, and it wins at 0 of the 6 sizes"),
        ("nb01-rule", "PLD 1.30x the baseline's tokens/s, realized speed-up 1.02", "1.30× the baseline's tokens/s,\n> a realized speed-up of 1.02"),
    ],
    "02": [
        ('nb02-rule', "FLOPs to the baseline's final loss: 0/5 reached (not within 1.00x)",
         "no seed reaches the baseline's loss\n> within its FLOPs"),
        ('nb02-rule', 'SBLD - same-size baseline at equal FLOPs: +0.039 [+0.017, +0.062] (n=5): loses',
         'SBLD loses: +0.039 [+0.017, +0.062] against the same-size baseline'),
        ('nb02-rule', 'SBLD - dense frontier (dense-L6-d32): +0.160',
         'frontier (+0.160)'),
        ('nb02-rule', '(ot_flops): SBLD - same-size baseline +0.032 [+0.003, +0.061] (n=5): loses',
         'its gap was +0.032\n> [+0.003, +0.061]: the same verdict'),
        ("nb02-38", "tutorial budget  0.68x [0.66, 0.70] (5/5 reached); sign test 5 below, 0 above (p=0.062)",
         "0.68x [0.66, 0.70], 5/5 seeds reached"),
        ("nb02-38", "profile charged         tutorial budget  0.73x [0.71, 0.75] (5/5 reached)", "0.73x [0.71, 0.75] (the sign test"),
        ("nb02-38", "50 tokens/param  2/5 reached: 1.00x, 0.98x; 3 not within 1.00x; sign test 1 below, 3 above, 1 within 1.1% of 1x (p=0.62)",
         "2/5 seeds reached (1.00x, 0.98x); sign test 1 below, 3 above"),
        ("nb02-38", "equal FLOPs       tutorial budget  -0.175 [-0.198, -0.152] (n=5): wins", "−0.175 [−0.198, −0.152]: **wins**"),
        ("nb02-38", "profile charged   tutorial budget  -0.159 [-0.181, -0.137] (n=5): wins", "profile charged, −0.159 [−0.181, −0.137]: **wins**"),
        ("nb02-38", "equal FLOPs       50 tokens/param  +0.011 [-0.008, +0.031] (n=5): not resolved at 5 seeds",
         "+0.011 [−0.008, +0.031]: not resolved at 5 seeds"),
        ("nb02-38", "tutorial budget  +0.356 [+0.324, +0.389] (n=5): loses", "+0.356 [+0.324, +0.389]: **loses**"),
        ("nb02-38", "50 tokens/param  +0.035 [+0.021, +0.049] (n=5): loses", "+0.035 [+0.021, +0.049]: **loses**"),
        ("nb02-38", "tutorial budget  -0.208 [-0.246, -0.170] (n=5): wins", "−0.208 [−0.246, −0.170]: **wins**"),
        ("nb02-38", "50 tokens/param  -0.075 [-0.096, -0.055] (n=5): wins", "−0.075 [−0.096, −0.055]: **wins**"),
        ("nb02-38", "tutorial budget  +0.136 [-0.189, +0.462] (n=3): not resolved at 3 seeds", "+0.136 [−0.189, +0.462], 3 seeds"),
        ("nb02-rule", "long_short     6 x 24  at  1.8 tokens per parameter: SBLD - same-size baseline +0.052 [-0.012, +0.117] (n=5): not resolved",
         "same 1.8 tokens per parameter (+0.052 [−0.012,\n> +0.117], not resolved)"),
        ("nb02-rule", "tutorial_flops 6 x 64  at  1.8 tokens per parameter: SBLD - same-size baseline -0.175 [-0.198, -0.152] (n=5): wins",
         "it wins at equal FLOPs (−0.175, and every seed"),
        ("nb02-rule", "long_flops     6 x 24  at 50.1 tokens per parameter: SBLD - same-size baseline +0.011 [-0.008, +0.031] (n=5): not resolved",
         "nor at 50 (+0.011, not resolved)"),
        ("nb02-rule", "the gap moves +0.199 [+0.125, +0.272] per tenfold N (3 df): rises; SBLD wins at 6 of 6 sizes",
         "+0.199 [+0.125, +0.272] per tenfold N"),
        ("nb02-rule", "mean gap by depth 4 blocks -0.156, 6 blocks -0.131, 12 blocks -0.063", "(−0.156 at 4 blocks, −0.063 at 12)"),
        ("nb02-rule", "SBLD 1.60x the baseline's tokens/s, realized speed-up 1.04", "ran at 1.60× the baseline's tokens/s, a realized speed-up of 1.04"),
    ],
    "03": [
        ('nb03-rule', "FLOPs to the baseline's final loss: 0/5 reached (not within 1.00x)",
         "no seed reaches the baseline's loss\n> within its FLOPs"),
        ('nb03-rule', 'random-LTD - same-size baseline at equal FLOPs: +0.033 [+0.017, +0.049] (n=5): loses',
         'random-LTD loses: +0.033 [+0.017, +0.049] against the same-size baseline'),
        ('nb03-rule', 'random-LTD - dense frontier (dense-L6-d32): +0.154',
         'frontier (+0.154)'),
        ('nb03-rule', '(ot_flops): random-LTD - same-size baseline +0.033 [-0.012, +0.078] (n=5): not resolved',
         'its gap was +0.033\n> [−0.012, +0.078]: not resolved'),
        ("c6382422", "equal FLOPs, 5 seeds: steps baseline 300, random_ltd 366, dense-L1 1466; tokens read: random_ltd 1.22x",
         "it takes 366 steps instead of 300, reads 1.22× the baseline's"),
        ("c6382422", "tokens per parameter (all parameters): baseline 1.8 (337,024 parameters), dense-L1 34.5 (87,104)",
         "reads 34.5 tokens per parameter at this budget"),
        ("c6382422", "equal steps, 3 seeds: random_ltd spends 0.822x the baseline's FLOPs", "spent 0.822× its\nFLOPs"),
        ("db62aa0b", "tutorial_steps: random_ltd 300 steps vs 300: whole run 0.832x the baseline's wall time", None),
        ("db62aa0b", "    to the same seed's baseline final loss, FLOPs: 0.63x [0.59, 0.66] (5/5 reached)",
         "with 0.63× [0.59, 0.66] of the baseline's FLOPs and about 0.70× of its wall time"),
        ("db62aa0b", "wall: 0.70x [0.68, 0.73] (5/5 reached)", None),
        ("ltd-long-time", "random_ltd's step time over the baseline's: 0.822, the median over 9 rounds", "A step costs 0.82× the baseline's on one core"),
        ("ltd-why", "tutorial budget  random_ltd       749,568      1.22x          2.2   -0.125 [-0.155, -0.096] (n=5): wins",
         "The same FLOPs buy random-LTD 1.22× the baseline's tokens in both regimes"),
        ("ltd-why", "50 tokens/param  random_ltd     3,502,080      1.22x         61.2   +0.038 [+0.029, +0.048] (n=5): loses", None),
        ("ltd-why", "tutorial budget  dense-L3       1,175,552      1.91x          6.3   -0.313 [-0.346, -0.280] (n=5): wins",
         "reading 1.91× the tokens, ends 0.313 nats/token below the baseline"),
        ("ltd-why", "50 tokens/param  dense-L3       5,244,928      1.83x        147.4   -0.024 [-0.037, -0.011] (n=5): wins",
         "`dense-L3`, reading 1.83× the tokens, ends only 0.024 below it"),
        ("ltd-verdicts", "fixed size tutorial budget  equal FLOPs, random_ltd - baseline: -0.125 [-0.155, -0.096] (n=5): wins; FLOPs to the "
         "baseline's loss 0.63x [0.59, 0.66] (5/5 reached)", "**wins** at equal FLOPs: −0.125 [−0.155, −0.096]; the baseline's final loss reached on 5/5 seeds, in 0.63× [0.59, 0.66]"),
        ("ltd-verdicts", "free size  tutorial budget  equal FLOPs, random_ltd - frontier: +0.406 [+0.372, +0.440] (n=5): loses",
         "**loses**: +0.406 [+0.372, +0.440] to `dense-L1`"),
        ("ltd-verdicts", "fixed size 50 tokens/param  equal FLOPs, random_ltd - baseline: +0.038 [+0.029, +0.048] (n=5): loses; FLOPs to "
         "the baseline's loss 0/5 reached", "**loses** at equal FLOPs: +0.038 [+0.029, +0.048]; the baseline's final loss reached within its FLOPs on 0/5 seeds"),
        ("ltd-verdicts", "free size  50 tokens/param  equal FLOPs, random_ltd - frontier: +0.062 [+0.057, +0.068] (n=5): loses",
         "**loses**: +0.062 [+0.057, +0.068] to `dense-L3`"),
        ("nb03-rule", "long_short     6 x 24  at  1.8 tokens per parameter: random-LTD - same-size baseline -0.098 [-0.257, +0.062] (n=5): not resolved",
         "it is not\n> resolved (−0.098 [−0.257, +0.062])"),
        ("nb03-rule", "tutorial_flops 6 x 64  at  1.8 tokens per parameter: random-LTD - same-size baseline -0.125 [-0.155, -0.096] (n=5): wins",
         "it wins at equal FLOPs (−0.125, every seed"),
        ("nb03-rule", "long_flops     6 x 24  at 50.1 tokens per parameter: random-LTD - same-size baseline +0.038 [+0.029, +0.048] (n=5): loses",
         "pay at 50 tokens per parameter (+0.038, loses)"),
        ("nb03-rule", "the gap moves -0.069 [-0.118, -0.020] per tenfold N (3 df): falls; random-LTD wins at 4 of 6 sizes",
         "it wins at 4 of the 6 sizes, its\n> gap moving −0.069 [−0.118, −0.020] per tenfold N"),
        ("nb03-rule", "mean gap by depth 4 blocks -0.032, 6 blocks -0.049, 12 blocks -0.066", "(−0.032 at 4 blocks, −0.066 at 12)"),
        ("nb03-rule", "random-LTD 0.99x the baseline's tokens/s, realized speed-up -0.05 (time saving -1.5% / FLOPs saving +33.1%)",
         "ran at 0.99× the baseline's tokens/s for 33% fewer FLOPs, a realized speed-up of −0.05"),
        ("nb03-rule", "r = 64: a step costs 0.42x the baseline's for 0.41x its FLOPs", "a step at r = 64 costs 0.42× the baseline's for 0.41× its\n> FLOPs"),
        ("nb03-rule", "(S = 64, 4 of 6 blocks dropping, r ramping 16 -> 64): 0.83x the baseline's step for 0.82x its FLOPs", "against 0.83× for 0.82× on the tutorial model"),
        ("d5dc7bf3", "step   0: r = 16  P(skipped by all 4 middle blocks) = (1 - 16/64)^4 = 0.3164", "about one token in three (0.316) skips every middle block"),
    ],
    "04": [
        ('nb04-rule', 'the V-cycle - same-size baseline at equal FLOPs: -0.006 [-0.020, +0.008] (n=5): not resolved',
         'same-size baseline is −0.006 [−0.020, +0.008], not\n> resolved'),
        ('nb04-rule', "FLOPs to the baseline's final loss: 3/5 reached",
         "3 of 5 seeds reach the baseline's loss within its FLOPs"),
        ('nb04-rule', 'the V-cycle - dense frontier (dense-L6-d32): +0.115',
         'frontier (+0.115)'),
        ('nb04-rule', '(ot_flops): the V-cycle - same-size baseline -0.017 [-0.064, +0.029] (n=5): not resolved',
         'its gap was −0.017 [−0.064, +0.029]: the same verdict'),
        ("nb04-24", "multilevel  steps  320  x0.65 FLOPs  reads 1.07x the baseline's tokens", "the cycle's 320 steps\nread 1.07× the baseline's tokens"),
        ("nb04-24", "tokens read per parameter (all parameters): baseline 1.8, dense-L1 34.5", "(34.5 tokens per parameter at this budget)"),
        ("nb04-long-table", "the V-cycle's coarse model: 3 blocks of width 12, 1 head(s); at this budget the cycle runs 2249 steps, reads 1.61x",
         "runs 2,249 steps (the baseline 1,400) and\n  reads 1.61× the baseline's tokens"),
        ("nb04-why", "tutorial budget  multilevel     1,017,856      1.66x          3.0   -0.033 [-0.043, -0.023] (n=5): wins", "(1.66× and 1.61×)"),
        ("nb04-why", "tutorial budget  dense-L3       1,175,552      1.91x          6.3   -0.313 [-0.346, -0.280] (n=5): wins",
         "reading 1.91× the\n  tokens, ends 0.313 nats/token below the baseline"),
        ("nb04-why", "50 tokens/param  dense-L3       5,244,928      1.83x        147.4   -0.024 [-0.037, -0.011] (n=5): wins",
         "reading 1.83× the\n  tokens, ends only 0.024 below it"),
        ("nb04-verdicts", "fixed size tutorial budget  equal FLOPs, V-cycle - baseline: -0.033 [-0.043, -0.023] (n=5): wins; FLOPs to the "
         "baseline's loss 0.87x [0.84, 0.90] (5/5 reached)", "**wins** at equal FLOPs: −0.033 [−0.043, −0.023]; the baseline's final loss reached on 5/5 seeds in 0.87× [0.84, 0.90]"),
        ("nb04-verdicts", "free size  tutorial budget  equal FLOPs, V-cycle - frontier: +0.499 [+0.468, +0.529] (n=5): loses",
         "**loses**: +0.499 [+0.468, +0.529] to `dense-L1`"),
        ("nb04-verdicts", "fixed size 50 tokens/param  equal FLOPs, V-cycle - baseline: +0.035 [+0.012, +0.057] (n=5): loses; FLOPs to the "
         "baseline's loss 0/5 reached", "**loses** at equal FLOPs: +0.035 [+0.012, +0.057]; the baseline's final loss reached within its FLOPs on 0/5 seeds"),
        ("nb04-verdicts", "free size  50 tokens/param  equal FLOPs, V-cycle - frontier: +0.059 [+0.036, +0.081] (n=5): loses",
         "**loses**: +0.059 [+0.036, +0.081] to `dense-L3`"),
        ("nb04-verdicts", "equal steps, tutorial budget (the cycle reads 1.07x the baseline's tokens): V-cycle - baseline +0.164 [+0.113, +0.215] (n=3): loses",
         "(the cycle reads 1.07× the baseline's tokens, spends 0.65× its FLOPs): +0.164 [+0.113, +0.215], 3 seeds"),
        ("nb04-rule", "long_short     6 x 24  at  1.8 tokens per parameter: the V-cycle - same-size baseline -0.207 [-0.446, +0.032] (n=5): not resolved",
         "same 1.8 tokens per parameter (−0.207 [−0.446, +0.032])"),
        ("nb04-rule", "tutorial_flops 6 x 64  at  1.8 tokens per parameter: the V-cycle - same-size baseline -0.033 [-0.043, -0.023] (n=5): wins",
         "it wins at equal FLOPs (−0.033, every"),
        ("nb04-rule", "long_flops     6 x 24  at 50.1 tokens per parameter: the V-cycle - same-size baseline +0.035 [+0.012, +0.057] (n=5): loses",
         "loses at 50 (+0.035)"),
        ("nb04-rule", "the gap moves +0.042 [-0.077, +0.160] per tenfold N (3 df): flat within noise; the V-cycle wins at 1 of 6 sizes",
         "it wins at only 1 of the 6 sizes, its gap flat in\n> depth (+0.042 [−0.077, +0.160] per tenfold N)"),
        ("nb04-rule", "half-size level (6 x 384) at 1.87x the full-size level's (12 x 768) tokens/s, realized speed-up 0.47",
         "the half-size level ran at 1.87× the full-size level's tokens/s, and the whole cycle predicted from the record's\n> points (`configs/multilevel_gpt_base.yaml`) realizes 0.47 of its FLOPs saving"),
    ],
    "05": [
        ("a8266985", "(0.38x the standard order's exposure)", "layered order exposes **0.38×** the standard order's"),
        ("c93d0923", "gpipe 4 1  4   0.840        0.750         46.8", "GPipe 46.8 ms at $m=4$"),
        ("c93d0923", "gpipe 4 1  8   0.454        0.375         92.5", "92.5 ms at $m=8$"),
        ("c93d0923", "looped_bfs 4 2  4   0.488        0.375         53.8       0.398", "53.8–64.5 ms"),
        ("c93d0923", "interleaved_1f1b 4 2  4   0.485        0.375         64.5", None),
        ("c93d0923", "interleaved_1f1b 4 2  8   0.301        0.188        131.0", "131.0–165.5 ms"),
        ("c93d0923", "looped_bfs 4 2  8   0.325        0.188        165.5", None),
        ("nb05-combo-code", "looped_bfs       after_step     3182      3084        3084  +3.2%       1045",
         "cuts the step from 3182 to 2480 ms and the exposed\ncommunication from 1045 to 324 ms"),
        ("nb05-combo-code", "looped_bfs       per_stage      2480      2364        2301  +4.9%        324", None),
        ("nb05-combo-code", "interleaved_1f1b per_stage      2685      2604           —  +3.1%        546", "(546 ms exposed)"),
        ("nb05-combo-code", "looped_bfs per_stage: 7.8% above the planner's closed form", "is 7.8% above the planner's closed form"),
        ("e227305b", "-> 0.043 s = 28% of the earlier step", "adds 28% / 19% / 9% of their step"),
        ("e227305b", "-> 0.268 s = 19% of the earlier step", "19% at $10^{11}$"),
        ("e227305b", "-> 1.299 s = 9% of the earlier step", None),
        ("e227305b", "1e+10: 0.54 / 1.00 / 1.00", "With the half point at $2^{16}$ the ratio is 0.54 again"),
        ("e227305b", "1e+10 n_t 8: 0.89", "which gives 0.89 η"),
        ("41f05df8", "none (earlier model) 0.52 [ 7224 -> 14448;    291 ->    305]  0.51 [15312 -> 30624;   6491 ->   6622]  0.15",
         "earlier cost model 0.52 / 0.51 / 0.15"),
        ("41f05df8", "p2p overlapped       0.78 [ 7224 ->  9632;    291 ->    304]  0.75", "leaves 0.78 and 0.75"),
        ("41f05df8", "ZeRO-3 gathers       0.71 [ 7224 ->  9632;    319 ->    300]  0.47 [15312 -> 30624;   7220 ->   6763]  0.45",
         "at $10^{11}$ and $10^{12}$ (0.47 and 0.45)"),
        ("41f05df8", "all (default)        1.00 [ 7224 ->  7224;    305 ->    305]  1.00 [15312 -> 15312;   6574 ->   6574]  0.16 [10752 -> 64896",
         "ZeRO-1 gives 1.00 / 1.00 / 0.16"),
        ("41f05df8", "all (default)        0.81 [ 3608 ->  4816;    295 ->    321]  1.00 [15312 -> 15312;   7264 ->   7264]  0.50",
         "ZeRO-3 gives 0.81 / 1.00 / 0.50"),
        ("41f05df8", "all, p2p overlapped  1.00 [ 7224 ->  7224;    305 ->    305]  0.78", "0.78 with\noverlapped sends"),
        ("41f05df8", "all, p2p split       1.00 [ 7224 ->  7224;    305 ->    305]  0.53", "0.53 when the tensor ranks split each message"),
        ("41f05df8", "all, p2p split       0.80 [ 3608 ->  4816;    295 ->    313]  0.50", "(0.50 under ZeRO-3)"),
        ("ddd8486b", "none (earlier model)   1e+10  1.00 (1.0x GPUs)  0.62 (1.3x GPUs)  0.52 (2.0x GPUs)  0.76 (1.3x GPUs)",
         "0.62 / 0.59 at 50%, 0.52 / 0.51 at 80%, 0.76 / 0.51 at 90%"),
        ("ddd8486b", "none (earlier model)   1e+11  0.98 (0.5x GPUs)  0.59 (1.3x GPUs)  0.51 (2.0x GPUs)  0.51 (2.0x GPUs)",
         "no floor gives 1.00 / 0.98"),
        ("ddd8486b", "all (default)          1e+10  1.00 (1.0x GPUs)  0.85 (1.0x GPUs)", "0.85 / 0.70 at a 50% floor"),
        ("ddd8486b", "all (default)          1e+11  1.00 (0.5x GPUs)  0.70 (1.3x GPUs)  1.00 (1.0x GPUs)  1.00 (1.0x GPUs)", None),
        ("ddd8486b", "all, p2p overlapped    1e+10  1.13 (4.0x GPUs)", "13% slower at $10^{10}$"),
        ("ddd8486b", "all, p2p split         1e+11  0.98 (0.5x GPUs)  0.62 (1.3x GPUs)  0.53 (2.0x GPUs)  1.00 (1.0x GPUs)",
         "$10^{11}$ keeps 0.53 at 80%"),
        ("97252db0", "ZeRO-1: ratio 0.150", "gives 0.15 under ZeRO-1 but 0.505 under ZeRO-3"),
        ("97252db0", "ZeRO-3: ratio 0.505", None),
        ("97252db0", "baseline: n_p 16, m 96, n_d   84 -> 10752 GPUs, 15.49 days", "10,752 GPUs, 15.5 days"),
        ("97252db0", "improved: n_p  8, m  8, n_d 1014 -> 64896 GPUs,  2.32 days", "64,896 GPUs, 2.3 days"),
        ("97252db0", "baseline n_p 8, m 48: model states 63.6 GB", "beside 63.6 GB of model states"),
        ("97252db0", "baseline n_p 8, m 48: bubble 0.146, useful fraction 0.839, 80.5 GB", "80.5 GB"),
        ("97252db0", "ZeRO-1 on 160 GB GPUs: ratio 0.148", "stays near 0.15 even on 160 GB GPUs"),
        ("97252db0", "ZeRO-1 on 600 GB GPUs: ratio 0.505", None),
        ("90ab808b", "improved, ZeRO-1: 79.6 GB = model states 62.7 + activations and workspace 16.9",
         "holds 62.7 GB of weights, gradients and sharded optimizer state, plus 16.9 GB"),
        ("90ab808b", "ZeRO-1, least memory among plans at most 100% slower than the fastest: 48.3 GB", "no lower than\n48.3 GB"),
        ("90ab808b", "the same plan, ZeRO-3: 17.1 GB, model states 0.25 GB = 0.3% of the GPU", "holds 0.25 GB of states (0.3% of the GPU)"),
        ("b417841f", "exposed reduction 55.0 vs 143.5 ms = 0.38x the standard order's; activations at m = 16 (175B-like, P = 8): 1.93x",
         "(1.93× at $m = 16$ for a 175B-like model, planner)"),
        ("b417841f", "bubble 0.488 vs GPipe 0.840 (closed forms 0.375, 0.750)", "looped BFS **0.488** vs GPipe **0.840**"),
        ("b417841f", "step 2480 vs 3182 ms = 0.78x", "step **0.78×** the after-step reduction's"),
        ("b417841f", "earlier model [0.52, 0.51, 0.15], all costs [1.0, 1.0, 0.16]", "**1.00 / 1.00 / 0.16**"),
    ],
    "06": [
        ("4be950b4", " 4  [3, 2, 1, 0]          [1, 2, 2, 1]                3   [0, 1, 2, 0]", "$[1, 2, 2, 1]$ blocks on 3 processes"),
        ("f4c71081", " 3         2 [1, 3, 2]            18      10     1.80x   9 units (0.90x Ouroboros's speed)", "1.8× on 2 processes ($K=3$)"),
        ("f4c71081", " 4         3 [1, 2, 2, 1]         18       9     2.00x   6 units (0.67x Ouroboros's speed)", "2× on 3 ($K=4$)"),
        ("f4c71081", " 5         4 [1, 2, 1, 1, 1]      18       8     2.25x", "2.25× on 4 or 5"),
        ("26fd0bc7", "module 1: -- -- -- x0 x1 x2 x3 x4", None),
        ("26fd0bc7", "module 4: x0 x1 x2 x3 x4 x5 x6 x7", None),
        ("eb427c62", " 2 ouroboros_k2     300        2.6930 ± 0.0427   2.6876, 2.7381, 2.6533   +0.360 [+0.226, +0.494] (n=3): loses",
         "$K=2$ by +0.36 nats/token [+0.23, +0.49]"),
        ("eb427c62", " 3 ouroboros_k3     300        2.7947 ± 0.0304   2.7604, 2.8181, 2.8056   +0.462 [+0.353, +0.571] (n=3): loses",
         "$K=3$ by\n+0.46 [+0.35, +0.57]"),
        ("eb427c62", " 4 ouroboros_k4     300        2.8990 ± 0.0593   2.9458, 2.9189, 2.8324   +0.566 [+0.417, +0.715] (n=3): loses",
         "$K=4$ by +0.57 [+0.42, +0.72]"),
        ("eb427c62", "K=3 - K=2: +0.102 [-0.008, +0.211] (n=3): not resolved at 3 seeds", "reach down to −0.01 and −0.09"),
        ("eb427c62", "K=4 - K=3: +0.104 [-0.093, +0.301] (n=3): not resolved at 3 seeds", None),
        ("2f2223c0", "K=2: gap at steps 50/100/300: +0.440/", "(+0.440, +0.575, +0.605\nnats/token for $K = 2, 3, 4$"),
        ("2f2223c0", "K=3: gap at steps 50/100/300: +0.575/", None),
        ("2f2223c0", "K=4: gap at steps 50/100/300: +0.605/", None),
        ("2f2223c0", "K=2: gap at step 300 minus gap at step 50, paired by seed: -0.080", "0.08, 0.11 and 0.04 nats/token"),
        ("2f2223c0", "K=3: gap at step 300 minus gap at step 50, paired by seed: -0.113 [-0.209, -0.018] (n=3): wins", None),
        ("2f2223c0", "K=4: gap at step 300 minus gap at step 50, paired by seed: -0.039", None),
        ("46225c7f", " 2        2.566 ± 0.003   +0.233 [+0.198, +0.268] (n=3): loses", "150-step warm-up, +0.23 nats/token"),
        ("46225c7f", " 2        2.574 ± 0.013   +0.242", "(+0.24, +0.23 and +0.24 under the three gentler"),
        ("46225c7f", " 2        2.575 ± 0.002   +0.242", None),
        ("46225c7f", " 3        2.790 ± 0.010   +0.457", "changes nothing (+0.46, not resolved)"),
        ("46225c7f", " 3        2.636 ± 0.024   +0.303", "the gap narrows to +0.30, and to +0.29"),
        ("46225c7f", " 3        2.624 ± 0.008   +0.291", None),
        ("46225c7f", " 4        2.900 ± 0.023   +0.567", "(+0.57 and +0.61, not resolved)"),
        ("46225c7f", " 4        2.948 ± 0.039   +0.615", None),
        ("46225c7f", " 4        2.726 ± 0.013   +0.393", "(+0.57 to +0.39, **wins**)"),
        ("46225c7f", " 1        2.391 ± 0.006   +0.058", "+0.06, +0.05 and +0.10 nats/token"),
        ("46225c7f", " 1        2.385 ± 0.011   +0.052", None),
        ("46225c7f", " 1        2.436 ± 0.005   +0.103", None),
        ("46225c7f", "+0.140 [+0.124, +0.156] (n=3): loses", "the smallest cost of the\nstaleness is +0.14"),
        ("8072ef2a", "the best Ouroboros arm: ouroboros_k2@lr0.0035_wu150 (LR 0.0035, warm-up 150), 2.566 nats/token", None),
        ("8072ef2a", "ouroboros_k2@lr0.0035_wu150 - frontier: +0.755 [+0.737, +0.772] (n=3): loses", "+0.755 nats/token [+0.737, +0.772]"),
        ("8072ef2a", "tuned baseline - frontier: +0.522 [+0.499, +0.545] (n=3): loses", "the tuned baseline itself (+0.522)"),
        ("8072ef2a", "steps {'dense-L1': 1466.0}", "1,466 steps"),
        ("08ce9f11", " 3                1.75x (1.80x)                      0.90x (0.90x)", "1.75× faster than the\nbackward-locked split"),
        ("08ce9f11", " 4                1.98x (2.00x)                      0.70x (0.67x)", "0.90× and 0.70× its speed"),
        ("89302983", "measured above ideal: 3.8-9.6%; overhead 12.5-28.1 ms", "3.8–9.6% above its ideal"),
        ("89302983", " 2              2.693                           75          1.00x                            0.25", "(0.25–0.33, last column)"),
        ("89302983", " 4              2.899                           50          1.98x                            0.33", None),
        ("89302983", " 3              2.624                          100          1.75x                            0.58", "in 0.33–0.58 of the time"),
        ("749c0760", "0 of 36 Ouroboros runs (12 arms x 3 seeds) ever reach their seed's baseline final loss", "none of the 36 runs"),
        ("749c0760", "in 0.25-0.58 of Ouroboros's measured time", "in 0.25–0.58 of its time"),
        ("749c0760", "best Ouroboros arm +0.757 [+0.745, +0.770] (n=3): loses; K=3 at the tuned schedule +0.986 [+0.900, +1.072] (n=3): loses",
         "+0.757 [+0.745, +0.770] to `dense-L1`"),
    ],
    "07": [
        ("c07-08", "(1,6,9) naive: 1024;  (1,6,9) chunks of 64: 2036", "Exactly **1024** $= 2^{m+1}$"),
        ("c07-24", "most bits needed per pass (naive): {'forward': 3, 'backward': 3, 'weight_grad': 5}; with chunks of 32 / 64: 3 / 3",
         "**5 bits naive and 3 bits with chunks of 32**"),
        ("c07-24", "16384 tokens (GPT-2 small's micro-batch): 9 bits naive, 6 with chunks of 64", "9 naive or 6 with chunks at 16,384 tokens"),
        ("c07-34", "baseline            300        2.4685 ± 0.0115", "baseline ends at 2.4685 ± 0.0115 nats/token"),
        ("c07-34", "fp8_fp32acc         300        2.4517 ± 0.0118   2.4618, 2.4545, 2.4387   -0.0168 [-0.0240, -0.0097] (n=3): wins",
         "−0.0168 nats/token [−0.0240, −0.0097]"),
        ("c07-34", "fp8_naive           300        2.4580 ± 0.0067   2.4585, 2.4644, 2.4510   -0.0105", "(−0.0070 to −0.0105)"),
        ("c07-34", "fp8_chunk64         300        2.4588 ± 0.0152   2.4589, 2.4740, 2.4437   -0.0097", "2.4588 ± 0.0152"),
        ("c07-34", "fp8_chunk64_rne     300        2.4615 ± 0.0147   2.4724, 2.4673, 2.4448   -0.0070", "2.4615 ± 0.0147"),
        ("c07-34", "fp8_naive - fp8_chunk64, paired by seed: -0.0009 [-0.0219, +0.0202] (n=3): not resolved at 3 seeds; per seed -0.0003, -0.0096, +0.0073",
         "−0.0009 nats/token [−0.0219, +0.0202] paired (per seed\n  −0.0003, −0.0096, +0.0073)"),
        ("c07-34", "fp8_chunk64_rne - fp8_chunk64, paired by seed: +0.0027 [-0.0226, +0.0279] (n=3): not resolved at 3 seeds; per seed +0.0135, -0.0067, +0.0012",
         "+0.0027 [−0.0226, +0.0279] (per seed +0.0135,\n  −0.0067, +0.0012)"),
        ("c07-34", "fp8_fp32acc - baseline, per seed: -0.0185, -0.0135, -0.0185", "0.014 to 0.019"),
        ("8fa77c51", "fp8_naive - fp32 baseline at equal steps (= equal FLOPs): -0.0105 [-0.0349, +0.0139] (n=3): not resolved at 3 seeds",
         "Naive (1,6,9): −0.0105 [−0.0349, +0.0139]"),
        ("8fa77c51", "fp8_chunk64 - fp32 baseline at equal steps (= equal FLOPs): -0.0097 [-0.0448, +0.0254] (n=3): not resolved at 3 seeds",
         "chunked (Wang et al.'s recipe): −0.0097 [−0.0448, +0.0254]"),
        ("8fa77c51", "fp8_chunk64_rne - fp32 baseline at equal steps (= equal FLOPs): -0.0070 [-0.0217, +0.0077] (n=3): not resolved at 3 seeds",
         "−0.0070 [−0.0217, +0.0077]"),
        ("8fa77c51", "the accumulator sweep's only stall is 2-bit naive (+0.189)", "only 2-bit naive stalled (+0.189)"),
        ("8fa77c51", "the emulation's cost on this CPU: 58x the fp32 step", "a step costs 58× the fp32 one on this CPU"),
        ("8fa77c51", "5 naive, 3 with chunks of 64 (K = 1024); 9 and 6 at K = 16384", "5 bits naive or 3 with chunks here"),
        ("8fa77c51", "300 steps = 2.24 tokens per parameter", "300 steps =\n> 2.24 tokens per parameter"),
    ],
    "08": [
        ("363eb324", "lr 1e-3: SL - none -0.082 [-0.127, -0.036] (n=10): wins", "error −0.082 [−0.127, −0.036]"),
        ("363eb324", "lr 1e-2: SL - none -0.151 [-0.441, +0.139] (n=5): not resolved at 5 seeds", "−0.151 [−0.441, +0.139] in error"),
        ("363eb324", "share of the none -> BN gap that SL closes: lr 1e-3 14%, lr 1e-2 33%, paper 83%", "SL closes 14% (lr $10^{-3}$) and 33%"),
        ("363eb324", "none                     0.109 ± 0.015 (10)", "0.109 ± 0.015, where chance is 0.10"),
        ("363eb324", "SL (w = 1)               0.191 ± 0.069 (10)     0.666 ± 0.047 (5)    0.752 ± 0.026", "SL reaches 0.191 ± 0.069"),
        ("363eb324", "BN (shift only)          0.704 ± 0.088 (10)     0.978 ± 0.007 (5)    0.856 ± 0.011", "BN 0.704 ± 0.088"),
        ("dff2a6e6", "none step 3700 (2/3 seeds), SL (w = 1) step 300 (3/3 seeds)", "at step 3700 (median of 3 seeds; one seed never does), SL itself at step 300"),
        ("c0e6bb72", "w = 1 - w = 0.1: -0.081 [-0.293, +0.131] (n=3): not resolved at 3 seeds", "−0.081 [−0.293, +0.131]"),
        ("ede26c60", "lr 0.01: BN's error at batch 2 - at batch 128 (by seed index, not paired): +0.666 [+0.566, +0.766] (n=3): loses", "by 0.666 [0.566, 0.766]"),
        ("ede26c60", "lr 0.001: BN's error at batch 2 - at batch 128 (by seed index, not paired): +0.435 [-0.009, +0.880] (n=3): not resolved", "+0.435 [−0.009, +0.880] in\nerror"),
        ("ede26c60", "batch   2: SL - none - (every seed diverged);  BN - none +0.133 [-0.059, +0.325] (n=3): not resolved at 3 seeds", "(+0.133 [−0.059, +0.325] in error)"),
        ("c75fa075", "no LN - LayerNorm (tutorial baseline), paired by seed: +0.093 [-0.027, +0.213] (n=3): not resolved at 3 seeds", "+0.093 [−0.027, +0.213]"),
        ("c75fa075", "no LN + SL (w = 0.001) - no LN, paired by seed: -0.027 [-0.127, +0.073] (n=3): not resolved at 3 seeds", "(−0.027 [−0.127, +0.073])"),
        ("c75fa075", "no LN + SL (w = 0.001) - LayerNorm (tutorial baseline), paired by seed: +0.066 [+0.043, +0.089] (n=3): loses",
         "no LN + SL against LN **loses**: +0.066 [+0.043, +0.089] nats/token"),
        ("af329ae7", "digits CNN: 1000 steps x 128 images = 89 epochs of 1438 training images", "1000 steps = 89 epochs of 1438 images"),
        ("af329ae7", "free size, GPT: no LN + SL - the tutorial frontier (dense-L1, bracketed: True): +0.590 [+0.564, +0.616] (n=3): loses",
         "+0.590 [+0.564, +0.616] nats/token"),
    ],
    "09": [
        ("nb09-03", "baselines: 0.13 to 1.30 tokens per parameter, 15x to 160x below the compute-optimal ~20",
         "between 0.13 and 1.30 tokens per parameter (all\nparameters counted; printed above): 15 to 160 times fewer"),
        ("nb09-03", "  4   64       237,056 7.00e-03", "Over 0.24M–2.45M parameters"),
        ("nb09-03", " 12  128     2,453,504 3.50e-03", None),
        ("nb09-03", "the 6 x 24 config's tuned LR is 1.53x the rule's", "the 6 × 24 config's tuned LR is 1.53× what it gives"),
        ("nb09-13", "t multipliers: 1 df 12.71, 3 df 3.18, 4 df 2.78", "the interval's t is 12.71 (against 2.78 at\n  4 df)"),
        ("nb09-13", "+0.167 [-0.031, +0.364] flat within noise", "width 64 +0.167 [−0.031, +0.364] per decade"),
        ("nb09-13", "-0.057 [-0.192, +0.079] flat within noise", "(width 64: −0.057 [−0.192, +0.079])"),
        ("nb09-13", "-0.069 [-0.118, -0.020] falls", "its interval ends at −0.020"),
        ("nb09-15", "sbld: gap to the compute-optimal plain model per decade of N (width 64, 1 df) +0.372 [+0.338, +0.406] rises",
         "(slope +0.372 [+0.338, +0.406] per decade"),
        ("nb09-15", "tokens per parameter at the optimum, the four budgets of the grid: 39-55", "at 39–55 tokens per parameter"),
        ("nb09-18", "pld: wins at 0, loses at 2, not resolved at 4 of 6 sizes; gap +0.025 to +0.040", "(by +0.025 to +0.040 nats)"),
        ("nb09-18", "sbld: wins at 6, loses at 0, not resolved at 0 of 6 sizes; gap -0.170 to -0.062", "wins at every size (−0.170 to −0.062)"),
        ("nb09-18", "gap to the compute-optimal plain model: +0.43 to +0.71 nats; it reads 34-98 tokens per parameter, the width-64 baselines 0.48-1.30",
         "reads 34–98 tokens per parameter, against 0.48–1.30 for the width-64 baselines"),
        ("nb09-21", "the 50-tokens-per-parameter baseline: 57,264 parameters (all), 2,867,200 tokens: 50.1 tokens per parameter (2.5x",
         "2.5 times Hoffmann\net al.'s ~20"),
        ("nb09-21", "its width-24 family's compute-optimum at this budget: 129 tokens per parameter [105, 160]; the baseline is 1.5x",
         "puts its optimum at about 129 (printed in section 6)"),
        ("nb09-21", "the sweep's 6 x 64 baseline: 337,024 parameters (all), 307,200 tokens: 0.91 tokens per parameter",
         "(under-trained,\n0.91 tokens per parameter, 3 seeds)"),
        ("nb09-24", "        pld   1.36x +0.040 [-0.003, +0.083] (n=3): not resolved at 3 seeds |   1.32x +0.086 [+0.071, +0.101] (n=5): loses",
         "| PLD | +0.040 [−0.003, +0.083] not resolved |"),
        ("nb09-24", "       sbld   1.67x -0.118 [-0.139, -0.098] (n=3): wins    |   1.58x +0.011 [-0.008, +0.031] (n=5): not resolved",
         "(1.22–1.67x the baseline's in the sweep, 1.22–1.61x at 50 tokens per parameter)"),
        ("nb09-24", " random_ltd   1.22x -0.047 [-0.066, -0.028] (n=3): wins    |   1.22x +0.038 [+0.029, +0.048] (n=5): loses", None),
        ("nb09-24", " multilevel   1.66x -0.041 [-0.067, -0.014] (n=3): wins    |   1.61x +0.035 [+0.012, +0.057] (n=5): loses", None),
        ("nb09-24", "   dense-L3   1.91x -0.268 [-0.283, -0.253] (n=3): wins    |   1.83x -0.024 [-0.037, -0.011] (n=5): wins",
         "reads 1.91x the baseline's tokens gains 0.268 nats over it in the\n  sweep, and one that reads 1.83x gains 0.024"),
        ("nb09-26", "50 tokens/param, equal FLOPs: vs same size +0.086 [+0.071, +0.101] (n=5): loses; vs frontier +0.110 [+0.093, +0.128] (n=5): loses",
         "| +0.086 [+0.071, +0.101] loses | +0.110 [+0.093, +0.128] loses |"),
        ("nb09-26", "50 tokens/param, equal FLOPs: vs same size +0.011 [-0.008, +0.031] (n=5): not resolved at 5 seeds; vs frontier +0.035 [+0.021, +0.049]",
         "| +0.011 [−0.008, +0.031] not resolved | +0.035 [+0.021, +0.049] loses |"),
        ("nb09-26", "50 tokens/param, equal FLOPs: vs same size +0.038 [+0.029, +0.048] (n=5): loses; vs frontier +0.062 [+0.057, +0.068] (n=5): loses",
         "| +0.038 [+0.029, +0.048] loses | +0.062 [+0.057, +0.068] loses |"),
        ("nb09-26", "50 tokens/param, equal FLOPs: vs same size +0.035 [+0.012, +0.057] (n=5): loses; vs frontier +0.059 [+0.036, +0.081] (n=5): loses",
         "| +0.035 [+0.012, +0.057] loses | +0.059 [+0.036, +0.081] loses |"),
        ("nb09-26", "FLOPs to the baseline's loss 2/5 reached: 1.00x, 0.98x; 3 not within 1.00x; sign test 1 below, 3 above, 1 within 1.1% of 1x (p=0.62)",
         "reached on 2 of 5 seeds (1.00x, 0.98x): not resolved"),
        ("nb09-26", "sweep 6 x 64: vs same size +0.040 [-0.003, +0.083] (n=3): not resolved at 3 seeds; vs the compute-optimal plain model +0.658 [+0.607, +0.709]",
         "| +0.658 [+0.607, +0.709] loses |"),
        ("nb09-26", "sweep 6 x 64: vs same size -0.118 [-0.139, -0.098] (n=3): wins; vs the compute-optimal plain model +0.500 [+0.478, +0.521]",
         "| −0.118 [−0.139, −0.098] wins | +0.500 [+0.478, +0.521] loses |"),
        ("nb09-26", "sweep 6 x 64: vs same size -0.047 [-0.066, -0.028] (n=3): wins; vs the compute-optimal plain model +0.571 [+0.557, +0.584]",
         "| −0.047 [−0.066, −0.028] wins | +0.571 [+0.557, +0.584] loses |"),
        ("nb09-26", "sweep 6 x 64: vs same size -0.041 [-0.067, -0.014] (n=3): wins; vs the compute-optimal plain model +0.577 [+0.548, +0.606]",
         "| −0.041 [−0.067, −0.014] wins | +0.577 [+0.548, +0.606] loses |"),
        ("nb09-26", "the 3-block plain model (the frontier), FLOPs to the 6-block baseline's loss: 0.85x [0.83, 0.88] (5/5 reached)",
         "with 0.85x [0.83, 0.88] of its FLOPs"),
    ],
}


def cells(nb: str) -> list[dict]:
    return json.loads(NB[nb].read_text())["cells"]


def printed(cell: dict) -> str:
    return "".join("".join(o.get("text", "")) + "".join(o.get("data", {}).get("text/plain", "")) for o in cell["outputs"])


def text(nb: str) -> str:
    return "\n".join("".join(c["source"]) for c in cells(nb) if c["cell_type"] == "markdown")


@pytest.mark.parametrize("nb, cid, out, said", [(nb, *row) for nb, rows in QUOTES.items() for row in rows],
                         ids=lambda v: v if isinstance(v, str) and len(v) < 20 else None)
def test_a_quoted_number_is_printed_by_a_compared_cell_and_stated_in_the_text(nb, cid, out, said):
    cell = next(c for c in cells(nb) if c.get("id") == cid)
    assert "NBVAL_IGNORE_OUTPUT" not in "".join(cell["source"]), f"{nb} {cid}: nbval does not compare this output"
    assert out in printed(cell), f"{nb} cell {cid} no longer prints {out!r}"
    if said:
        assert said in text(nb), f"{nb}'s text no longer says {said!r} (its cell {cid} prints {out!r})"


def box(nb: str) -> str:
    found = [s for s in ("".join(c["source"]) for c in cells(nb) if c["cell_type"] == "markdown")
             if "**When would you use it?**" in s]
    assert len(found) == 1, nb
    return found[0]


@pytest.mark.parametrize("nb", BOXES)
def test_the_box_says_only_what_applies(nb):
    # the two-framing boilerplate where it does not apply (issue 45): no tie by construction, no "not measured" cells
    b = box(nb)
    assert "a tie by construction" not in b and "not measured" not in b and "**Decision rule.**" in b


@pytest.mark.parametrize("nb", SUMMARIES)
def test_each_notebook_ends_with_a_five_line_summary(nb):
    cs = cells(nb)
    at = [k for k, c in enumerate(cs) if c["cell_type"] == "markdown" and "".join(c["source"]).startswith("## Summary\n")]
    assert len(at) == 1, nb
    lines = "".join(cs[at[0]]["source"]).split("\n", 1)[1].strip().splitlines()
    assert len(lines) == 5 and all(line.startswith("* ") for line in lines), lines
    b = next((k for k, c in enumerate(cs) if "**When would you use it?**" in "".join(c["source"])), -1)
    assert at[0] > b and len(cs) - at[0] <= 3            # after the box, among the last cells (full scale, exercises)
    assert (nb in BOXES) == (b >= 0)                     # 00 and 09 have no box


def test_00_has_a_light_path_for_a_class():
    """Issue 45, item 6: the lm-eval scoring (and the check that reuses its scores) and the 2-process run are optional
    behind one flag (ACCELLIB_FULL=0, FULL in the cell after the setup cell); each skipped cell says so in one line,
    and the header states what the light path saves. The default is the full path (nbval runs it)."""
    cs = cells("00")
    assert 'FULL = os.environ.get("ACCELLIB_FULL", "1") != "0"' in "".join(cs[2]["source"])
    heavy = [c for c in cs if c["cell_type"] == "code" and any(k in "".join(c["source"]) for k in
                                                               ("evaluate_run(", "torchrun", "cloze_items("))]
    assert len(heavy) == 3
    for c in heavy:
        body = [line for line in "".join(c["source"]).splitlines() if not line.startswith("#")]
        assert body[0] == "if not FULL:" and body[1].lstrip().startswith('print("light path (ACCELLIB_FULL=0)')
        assert body[2] == "else:" and "light path" not in printed(c)          # the stored outputs are the full path's
    head = "".join(cs[0]["source"])
    assert "**A lighter path for a class.**" in head and "`ACCELLIB_FULL=0`" in head
