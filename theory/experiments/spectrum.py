"""Paper 2 Section 5 and Theorem 4: spectrum of Q_i A_i, condition-number reduction, K-MAML = Theta_{2K+1}.

Eigenvalues of Q_i(gamma, Theta_{1:K}) A_i are computed numerically (Q_i by Eq. 8 from the shared
``theta_weights``) and compared with phi_{K,lambda}(gamma) (Lemma 11); the surrogate condition number
phi_{K,L}/phi_{K,mu} <= L/mu shrinks with gamma and K (Corollary 13). Theorem 4 is checked on a random
quadratic: the K-MAML client output (gradient of f_i after K gradient steps, by torch autograd through the
shared ``sgd_step``) equals the LocalUpdate client output with Theta_{2K+1} (shared client functions).
"""

from __future__ import annotations

import os

import numpy as np

from strategies import math as fm
from theory import closed_forms as cf
from theory.output import new_figure, save_figure, write_outputs
from theory.problems import QuadraticClient, localupdate_client, localupdate_round


def random_spd(d: int, lo: float, hi: float, rng: np.random.Generator) -> np.ndarray:
    """Symmetric matrix with eigenvalues spread over [lo, hi] (both included)."""
    basis, _ = np.linalg.qr(rng.normal(size=(d, d)))
    eig = np.concatenate([[lo, hi], rng.uniform(lo, hi, size=d - 2)])
    return (basis * eig) @ basis.T


def spectrum(
    Ks=(1, 2, 5, 10, 20), n_gamma: int = 9, mu: float = 0.5, L: float = 4.0, d: int = 6, seed: int = 0
) -> dict:
    """Numerical eigenvalues of Q A vs phi (Lemma 11) and Theta_K (Lemma 12); condition numbers (Cor. 13)."""
    A = random_spd(d, mu, L, np.random.default_rng(seed))
    lam = np.linalg.eigvalsh(A)
    gammas = np.linspace(0.0, 0.95 / L, n_gamma)
    rows = []
    for K in Ks:
        for g in gammas:
            QA = cf.distortion_matrix(A, g, fm.theta_weights("fedavg", K)) @ A
            eig = np.sort(np.linalg.eigvals(QA).real)
            closed = np.sort(cf.phi(K, lam, g))
            QA_k = cf.distortion_matrix(A, g, fm.theta_weights("fomaml", K)) @ A
            eig_k = np.sort(np.linalg.eigvals(QA_k).real)
            closed_k = np.sort(cf.fomaml_eigenvalue(K, lam, g))
            rows.append(
                {
                    "K": K,
                    "gamma": float(g),
                    "lambda_max": eig[-1],
                    "phi_K_L": float(cf.phi(K, L, g)),
                    "lambda_min": eig[0],
                    "phi_K_mu": float(cf.phi(K, mu, g)),
                    "max_eig_err_fedavg": float(np.max(np.abs(eig - closed))),
                    "max_eig_err_fomaml": float(np.max(np.abs(eig_k - closed_k))),
                    "cond_numeric": float(eig[-1] / eig[0]),
                    "cond_closed": float(cf.phi(K, L, g) / cf.phi(K, mu, g)),
                    "cond_true": L / mu,
                }
            )
    return {"rows": rows, "setup": {"mu": mu, "L": L, "d": d, "seed": seed, "theta": "fedavg (Theta_{1:K})"}}


def maml_client_torch(x: np.ndarray, client: QuadraticClient, gamma: float, K: int) -> np.ndarray:
    """K-MAML client output grad_x f_i(X_K(x)), X_K = K gradient steps (shared ``sgd_step``), by autograd."""
    import torch

    A = torch.tensor(np.atleast_2d(client.A), dtype=torch.float64)
    c = torch.tensor(client.c, dtype=torch.float64)
    x0 = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    y = x0
    for _ in range(K):
        y = fm.sgd_step(y, A @ (y - c), gamma)
    loss = 0.5 * (y - c) @ (A @ (y - c))
    loss.backward()
    return x0.grad.numpy()


def maml_equivalence(Ks=(1, 2, 3, 5), gamma: float = 0.1, d: int = 4, clients: int = 3, seed: int = 1) -> dict:
    """Theorem 4: K-MAML client output == LocalUpdate(Theta_{2K+1}) client output; same for a server round."""
    rng = np.random.default_rng(seed)
    pop = [QuadraticClient(random_spd(d, 0.3, 3.0, rng), rng.normal(size=d)) for _ in range(clients)]
    weights = rng.uniform(1.0, 3.0, size=clients)
    x = rng.normal(size=d)
    rows = []
    for K in Ks:
        theta = fm.theta_weights("fomaml", 2 * K + 1)
        maml = [maml_client_torch(x, cl, gamma, K) for cl in pop]
        lu = [localupdate_client(x, cl.grad, gamma, theta) for cl in pop]
        maml_round = fm.localupdate_server_update([x], fm.weighted_mean([[q] for q in maml], weights), 0.5)[0]
        lu_round = localupdate_round(x, pop, weights, gamma, 0.5, theta)
        rows.append(
            {
                "K": K,
                "theta": f"Theta_{2 * K + 1}",
                "max_client_diff": float(max(np.max(np.abs(a - b)) for a, b in zip(maml, lu))),
                "server_round_diff": float(np.max(np.abs(maml_round - lu_round))),
                "client_norm": float(max(np.linalg.norm(a) for a in maml)),
            }
        )
    return {"rows": rows, "setup": {"gamma": gamma, "d": d, "clients": clients, "seed": seed}}


def run_spectrum(outdir: str | os.PathLike) -> dict:
    spec = spectrum()
    maml = maml_equivalence()
    fig, axes = new_figure(2)
    for K in sorted({r["K"] for r in spec["rows"]}):
        rs = [r for r in spec["rows"] if r["K"] == K]
        g = [r["gamma"] for r in rs]
        (h,) = axes[0].plot(g, [r["cond_numeric"] for r in rs], "o", ms=3)
        axes[0].plot(g, [r["cond_closed"] for r in rs], "-", color=h.get_color(), lw=1, label=f"K={K}")
        axes[1].plot(g, [r["lambda_max"] for r in rs], "o", ms=3, color=h.get_color())
        axes[1].plot(g, [r["phi_K_L"] for r in rs], "-", color=h.get_color(), lw=1, label=f"K={K}")
    axes[0].set(xlabel="gamma", ylabel="cond(Q A)", title="Cor. 13: phi_{K,L}/phi_{K,mu} (lines)")
    axes[1].set(xlabel="gamma", ylabel="lambda_max(Q A)", yscale="log", title="Lemma 11: phi_{K,L} (lines)")
    for ax in axes:
        ax.legend(fontsize=7)
    paths = write_outputs(outdir, "spectrum", spec["rows"], spec)
    paths.update({f"maml_{k}": v for k, v in write_outputs(outdir, "maml", maml["rows"], maml).items()})
    paths["png"] = save_figure(fig, outdir, "spectrum")
    return {"spectrum": spec, "maml": maml, "paths": paths}
