"""The service's registry in SQL: kernel sources, API tokens, best-schedule lookups.

* Kernel sources are content-addressed: the row's key is the sha256 of the
  UTF-8 source, which is also the ``source_hash`` a workload records for that
  file, so a result tuned from the CLI and one tuned by the service agree.
* Tokens are stored as their sha256 only; a token is looked up by its hash.
* The best-schedule lookup itself is ``Store.best_stored`` (repository.py).
  Results of two sources under one name are never compared: ``timed_sources``
  tells the caller which sources there are to choose from.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import func, select, update

from ..candidate import Lowering, sha256_hex
from ..result import Status
from .engine import utc
from .models import CandidateModel, KernelModel, TokenModel, TrialModel, WorkloadModel
from .repository import OnStore


@dataclass(frozen=True)
class KernelRecord:
    id: int
    sha256: str
    name: str
    size_bytes: int
    registered: bool
    problem: dict[str, Any] | None  # {"defaults": PROBLEM, "choices": CHOICES} of a registered file
    created_at: datetime


@dataclass(frozen=True)
class TokenRecord:
    id: int
    name: str
    prefix: str
    scopes: tuple[str, ...]
    created_at: datetime
    revoked_at: datetime | None


def _kernel(row: KernelModel) -> KernelRecord:
    return KernelRecord(
        id=row.id, sha256=row.sha256, name=row.name, size_bytes=row.size_bytes, registered=bool(row.registered),
        problem=json.loads(row.problem) if row.problem else None, created_at=utc(row.created_at),
    )  # fmt: skip


def _token(row: TokenModel) -> TokenRecord:
    return TokenRecord(
        id=row.id, name=row.name, prefix=row.prefix, scopes=tuple(row.scopes.split()),
        created_at=utc(row.created_at), revoked_at=utc(row.revoked_at) if row.revoked_at else None,
    )  # fmt: skip


class Registry(OnStore):
    """Kernel sources, API tokens and best-schedule lookups."""

    # --- kernels ----------------------------------------------------------------
    def put_kernel(
        self, name: str, source: str, *, registered: bool = False, problem: dict[str, Any] | None = None
    ) -> KernelRecord:
        """Store a source (once per content); ``registered`` marks it as the current
        file of that name in the server's kernel directories."""
        data = source.encode("utf-8")
        sha = sha256_hex(data)
        with self.store.session_scope() as session:
            session.execute(
                self.sql.upsert(KernelModel)
                .values(sha256=sha, name=name, source=source, size_bytes=len(data), registered=False)
                .on_conflict_do_nothing(index_elements=["sha256"])
            )
            if registered:
                session.execute(
                    update(KernelModel)
                    .where(KernelModel.sha256 == sha)
                    .values(registered=True, registered_at=func.now(), name=name,
                            problem=json.dumps(problem, sort_keys=True) if problem is not None else None)
                )  # fmt: skip
            row = session.scalars(select(KernelModel).where(KernelModel.sha256 == sha)).one()
            return _kernel(row)

    def kernel(self, sha256: str) -> KernelRecord | None:
        with self.store.session_scope(read_only=True) as session:
            row = session.scalars(select(KernelModel).where(KernelModel.sha256 == sha256)).first()
            return _kernel(row) if row else None

    def registered_kernel(self, name: str) -> KernelRecord | None:
        """The file most recently registered under ``name``."""
        query = (
            select(KernelModel)
            .where(KernelModel.name == name, KernelModel.registered.is_(True))
            .order_by(KernelModel.registered_at.desc(), KernelModel.id.desc())
            .limit(1)
        )
        with self.store.session_scope(read_only=True) as session:
            row = session.scalars(query).first()
            return _kernel(row) if row else None

    def kernel_source(self, kernel_id: int) -> tuple[str, str] | None:
        """(sha256, source) of a stored kernel. Workers call this; the API never serves it."""
        with self.store.session_scope(read_only=True) as session:
            row = session.execute(select(KernelModel.sha256, KernelModel.source).where(KernelModel.id == kernel_id)).first()
            return (row.sha256, row.source) if row else None

    def list_kernels(self, *, registered: bool | None = None, limit: int = 100, offset: int = 0) -> tuple[list[KernelRecord], int]:
        query = select(KernelModel)
        count = select(func.count()).select_from(KernelModel)
        if registered is not None:
            query = query.where(KernelModel.registered.is_(registered))
            count = count.where(KernelModel.registered.is_(registered))
        with self.store.session_scope(read_only=True) as session:
            rows = session.scalars(query.order_by(KernelModel.id.desc()).limit(limit).offset(offset)).all()
            return [_kernel(r) for r in rows], int(session.scalar(count) or 0)

    # --- tokens -----------------------------------------------------------------
    def add_token(self, *, name: str, token_hash: str, prefix: str, scopes: tuple[str, ...]) -> TokenRecord:
        with self.store.session_scope() as session:
            row = TokenModel(name=name, token_hash=token_hash, prefix=prefix, scopes=" ".join(scopes))
            session.add(row)
            session.flush()
            session.refresh(row)
            return _token(row)

    def token_by_hash(self, token_hash: str) -> TokenRecord | None:
        """The active (not revoked) token with this sha256."""
        query = select(TokenModel).where(TokenModel.token_hash == token_hash, TokenModel.revoked_at.is_(None))
        with self.store.session_scope(read_only=True) as session:
            row = session.scalars(query).first()
            return _token(row) if row else None

    def list_tokens(self, *, include_revoked: bool = False) -> list[TokenRecord]:
        query = select(TokenModel).order_by(TokenModel.id)
        if not include_revoked:
            query = query.where(TokenModel.revoked_at.is_(None))
        with self.store.session_scope(read_only=True) as session:
            return [_token(r) for r in session.scalars(query)]

    def revoke_token(self, ident: str) -> int:
        """Revoke by id or by prefix; returns how many tokens were revoked."""
        where = TokenModel.id == int(ident) if ident.isdigit() else TokenModel.prefix == ident
        with self.store.session_scope() as session:
            return session.execute(
                update(TokenModel).where(where, TokenModel.revoked_at.is_(None)).values(revoked_at=func.now())
            ).rowcount

    def active_token_count(self) -> int:
        with self.store.session_scope(read_only=True) as session:
            return int(session.scalar(select(func.count()).select_from(TokenModel).where(TokenModel.revoked_at.is_(None))) or 0)

    # --- lookups ----------------------------------------------------------------
    @staticmethod
    def _timed(kernel: str, problem: str, device: str) -> list[Any]:
        return [
            WorkloadModel.kernel == kernel,
            WorkloadModel.problem == problem,
            WorkloadModel.device == device,
            TrialModel.status == Status.OK.value,
            TrialModel.median_ms.is_not(None),
            # What tilelang can compile: a WS schedule or its own lowerings, never the
            # vendor reference (as ws_tuner.lookup.fastest_on_device).
            CandidateModel.lowering != Lowering.REFERENCE.value,
        ]

    def timed_sources(self, *, kernel: str, problem: str, device: str, limit: int = 2) -> list[str]:
        """Up to ``limit`` source hashes of ``kernel`` with a correct timed result at ``problem`` on ``device``."""
        query = (
            select(WorkloadModel.source_hash)
            .join(TrialModel, TrialModel.workload_id == WorkloadModel.id)
            .join(CandidateModel, TrialModel.candidate_id == CandidateModel.id)
            .where(*self._timed(kernel, problem, device))
            .distinct()
            .limit(limit)
        )
        with self.store.session_scope(read_only=True) as session:
            return list(session.scalars(query))
