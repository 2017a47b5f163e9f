"""f* = min_w f(w) of :class:`server.convex.objective.PopulationObjective` to ‖∇f‖₂ ≤ 1e-8, in float64.

Two stages on preconditioned coordinates (docs/convex.md "Solver"):

1. L-BFGS (scipy's L-BFGS-B without bounds, 20 correction pairs) from w = 0 (the zero init of ``model=logreg``);
2. scipy's trust-region Newton-CG (``trust-ncg``: Steihaug CG on exact Hessian-vector products, Nocedal & Wright
   2006 Alg. 7.2) to ‖∇f‖ ≈ 10·``tol``, then full Newton-CG steps accepted while ‖∇f‖₂ drops (quadratic convergence;
   a function-value test stalls at f's rounding there) until ‖∇f(w)‖₂ ≤ ``tol`` in the original coordinates.

Preconditioner: the rows w'_k = [w_k | b_k] are written w'_k = (Σ + δI)^{-1/2} u_k, Σ the second moment of
the affine inputs (:meth:`PopulationObjective.second_moment`) and δ = μ / 0.09 (0.09 = p(1 − p) of the uniform
softmax of w = 0 over 10 classes): the per-class loss Hessian ≈ p(1 − p) Σ and the μ term become ≈ p(1 − p) I, so
the condition number drops from ≈ λ_max(Σ)/(4μ) (10⁵–10⁶ on CIFAR-10) to the spread of p(1 − p). The softmax shift
(every w'_k + v) has no loss curvature, but every gradient sums to μ Σ_k w'_k over the classes, so iterates from 0
keep Σ_k w'_k = 0, where the true minimiser lies. For μ > 0, f is μ-strongly convex: the point found is within
‖∇f‖/μ of the unique minimiser and f(w) − f* ≤ ‖∇f‖²/(2μ) (Nesterov 2004, Thm 2.1.10).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch
from scipy.optimize import minimize
from scipy.sparse.linalg import LinearOperator, cg

from server.convex.objective import PopulationObjective

TOL = 1e-8  # ‖∇f‖₂ of the reported minimiser
SWITCH = 1e-3  # largest |preconditioned gradient entry| where L-BFGS hands over to the Newton polish
CURVATURE = 0.09  # p(1 − p) of the uniform softmax over 10 classes (δ = μ / CURVATURE)
LBFGS_MAXITER = 3000
NEWTON_MAXITER = 100
POLISH_STEPS = 20
SMALL = 10**8  # n·dim below which one torch thread is faster (many small products; OpenMP overhead dominates)


@dataclass
class Solution:
    """The minimiser found and how: f(w), ‖∇f(w)‖₂, iterations of each stage, seconds."""

    w: np.ndarray
    f_star: float
    grad_norm: float
    converged: bool
    lbfgs_iterations: int
    newton_iterations: int
    seconds: float  # wall clock
    cpu_seconds: float  # of this process (all threads): the figure that does not depend on other loads


class Preconditioned:
    """f̃(u) = f(w(u)) with rows w'_k = P u_k, P = (Σ + δI)^{-1/2}: value, gradient P∇f and Hessian-vector product
    P H P v. P = δ^{-1/2} I + Q diag((λ + δ)^{-1/2} − δ^{-1/2}) Qᵀ from the eigenpairs (λ, Q) of Σ, taken from the
    smaller of Σ and the n × n Gram matrix of √c_j x'_j (Σ has rank ≤ n), so a product costs 2·C·(d + 1)·rank."""

    def __init__(self, obj: PopulationObjective) -> None:
        self.obj = obj
        lam, self.q = self._eigen(obj)
        delta = obj.mu / CURVATURE + 1e-10 * float(lam.sum()) / (obj.num_features + 1)  # > 0 at μ = 0 too
        self.root = delta**-0.5
        self.inv_root = delta**0.5
        self.shrink = (lam + delta).rsqrt() - self.root  # P's correction on the span of Q
        self.grow = (lam + delta).sqrt() - self.inv_root  # P⁻¹'s
        self.scale = float((lam.max() + delta).sqrt())  # ‖P⁻¹‖₂: ‖∇f‖ ≤ scale · ‖∇f̃‖

    @staticmethod
    def _eigen(obj: PopulationObjective) -> tuple[torch.Tensor, torch.Tensor]:
        """Eigenvalues λ > 0 and orthonormal eigenvectors Q ((d + 1) × rank) of Σ."""
        if len(obj.x) > obj.num_features + 1:
            lam, q = torch.linalg.eigh(obj.second_moment())
        else:
            a = torch.cat([obj.x, torch.ones(len(obj.x), 1, dtype=torch.float64)], dim=1) * obj.c.sqrt()[:, None]
            lam, v = torch.linalg.eigh(a @ a.T)
            keep = lam > 1e-12 * lam.max()
            lam, q = lam[keep], (a.T @ v[:, keep]) / lam[keep].sqrt()
        return lam.clamp_min(0.0), q

    def _apply(self, rows: torch.Tensor, base: float, correction: torch.Tensor) -> np.ndarray:
        return self.obj.from_rows(base * rows + ((rows @ self.q) * correction) @ self.q.T)

    def w(self, u: np.ndarray) -> np.ndarray:
        """w(u): rows P u_k."""
        return self._apply(
            torch.as_tensor(np.asarray(u, dtype=np.float64)).view(self.obj.num_classes, -1), self.root, self.shrink
        )

    def u(self, w: np.ndarray) -> np.ndarray:
        """The inverse of :meth:`w`: rows P⁻¹ w'_k (as u, in the same row layout)."""
        rows = torch.as_tensor(self.obj.rows(w))
        return (self.inv_root * rows + ((rows @ self.q) * self.grow) @ self.q.T).reshape(-1).numpy()

    def _back(self, g: np.ndarray) -> np.ndarray:
        """P ∇f in the u layout (rows)."""
        rows = self.obj.rows(g)
        return (self.root * rows + ((rows @ self.q) * self.shrink) @ self.q.T).reshape(-1).numpy()

    def value(self, u: np.ndarray) -> float:
        return self.obj.value(self.w(u))

    def value_grad(self, u: np.ndarray) -> tuple[float, np.ndarray]:
        value, grad = self.obj.value_grad(self.w(u))
        return value, self._back(grad)

    def grad(self, u: np.ndarray) -> np.ndarray:
        return self.value_grad(u)[1]

    def hessp(self, u: np.ndarray, v: np.ndarray) -> np.ndarray:
        return self._back(self.obj.hessp(self.w(u), self.w(v)))  # w(·) is linear


def _polish(pre: Preconditioned, u: np.ndarray, tol: float) -> tuple[np.ndarray, int]:
    """Full Newton steps (CG on the preconditioned Hessian to relative residual 1e-6) accepted while they lower
    ‖∇f‖₂: near w* a function-value test (trust region, line search) cannot see decreases below f's rounding
    (‖∇f‖²/(2λ) ≈ 1e-16 · f), the gradient norm still can. Returns (u, steps)."""
    grad_norm = float(np.linalg.norm(pre.obj.grad(pre.w(u))))
    for step in range(POLISH_STEPS):
        if grad_norm <= tol:
            return u, step
        hess = LinearOperator((len(u), len(u)), matvec=lambda v, at=u: pre.hessp(at, v), dtype=np.float64)
        d, _ = cg(hess, -pre.grad(u), rtol=1e-6, maxiter=500)
        for _ in range(10):  # halve the step until the gradient norm drops
            new_norm = float(np.linalg.norm(pre.obj.grad(pre.w(u + d))))
            if new_norm < grad_norm:
                u, grad_norm = u + d, new_norm
                break
            d = d / 2
        else:
            return u, step
    return u, POLISH_STEPS


def solve(obj: PopulationObjective, tol: float = TOL, w0: np.ndarray | None = None, switch: float = SWITCH) -> Solution:
    """Minimise ``obj`` from ``w0`` (default 0): preconditioned L-BFGS, then trust-region Newton-CG polishes until
    ‖∇f‖₂ ≤ 10·``tol``, full Newton steps finish to ``tol`` (:func:`_polish`; ``converged`` False when they stall)."""
    threads = torch.get_num_threads()
    if len(obj.x) * obj.dim < SMALL:
        torch.set_num_threads(1)
    try:
        return _solve(obj, tol, w0, switch)
    finally:
        torch.set_num_threads(threads)


def _solve(obj: PopulationObjective, tol: float, w0: np.ndarray | None, switch: float) -> Solution:
    start, cpu = time.perf_counter(), time.process_time()
    pre = Preconditioned(obj)
    u = np.zeros(obj.dim) if w0 is None else pre.u(w0)
    res = minimize(
        pre.value_grad,
        u,
        jac=True,
        method="L-BFGS-B",
        options={"maxiter": LBFGS_MAXITER, "maxcor": 20, "ftol": 0.0, "gtol": switch, "maxls": 50},
    )
    u, lbfgs_iterations, newton_iterations = res.x, int(res.nit), 0
    res = minimize(
        pre.value,
        u,
        jac=pre.grad,
        hessp=pre.hessp,
        method="trust-ncg",
        options={"gtol": 10 * tol / pre.scale, "maxiter": NEWTON_MAXITER},
    )
    u, newton_iterations = _polish(pre, res.x, tol)
    newton_iterations += int(res.nit)
    w = pre.w(u)
    f_star, grad = obj.value_grad(w)
    grad_norm = float(np.linalg.norm(grad))
    return Solution(
        w,
        float(f_star),
        grad_norm,
        grad_norm <= tol,
        lbfgs_iterations,
        newton_iterations,
        time.perf_counter() - start,
        time.process_time() - cpu,
    )
