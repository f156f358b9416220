"""SQLAlchemy's ORM on an in-memory SQLite database: inserts, a join query, updates, deletes."""

from __future__ import annotations

import random
import time

import _common

deadline = _common.start_script()

from sqlalchemy import ForeignKey, create_engine, func, select  # noqa: E402
from sqlalchemy.orm import (  # noqa: E402
    DeclarativeBase,
    Mapped,
    Session,
    mapped_column,
    relationship,
    selectinload,
)


class Base(DeclarativeBase):
    pass


class Customer(Base):
    __tablename__ = "customer"
    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str]
    country: Mapped[str]
    orders: Mapped[list[Order]] = relationship(back_populates="customer")


class Order(Base):
    __tablename__ = "order"
    id: Mapped[int] = mapped_column(primary_key=True)
    customer_id: Mapped[int] = mapped_column(ForeignKey("customer.id"), index=True)
    total_cents: Mapped[int]
    status: Mapped[str]
    customer: Mapped[Customer] = relationship(back_populates="orders")


ENGINE = create_engine("sqlite://")
Base.metadata.create_all(ENGINE)
RNG = random.Random(3)
COUNTRIES = ["FR", "DE", "NL", "IT", "ES", "PT"]


def insert_batch(session: Session) -> None:
    for _ in range(50):
        customer = Customer(name=f"customer {RNG.randint(0, 10**6)}", country=RNG.choice(COUNTRIES))
        customer.orders = [
            Order(total_cents=RNG.randint(100, 50_000), status="new") for _ in range(4)
        ]
        session.add(customer)
    session.commit()


def query_and_update(session: Session) -> None:
    country = RNG.choice(COUNTRIES)
    customers = session.scalars(
        select(Customer)
        .where(Customer.country == country)
        .options(selectinload(Customer.orders))
        .limit(100)
    ).all()
    for customer in customers:
        for order in customer.orders:
            if order.total_cents > 25_000:
                order.status = "review"
    session.execute(
        select(Customer.country, func.count(Order.id), func.sum(Order.total_cents))
        .join(Order)
        .group_by(Customer.country)
    ).all()
    session.commit()


def trim(session: Session) -> None:
    # Keep the database small so every round does the same work.
    if session.scalar(select(func.count(Customer.id))) > 2000:
        for customer in session.scalars(select(Customer).limit(200)):
            for order in customer.orders:
                session.delete(order)
            session.delete(customer)
        session.commit()


def round_once() -> None:
    with Session(ENGINE) as session:
        insert_batch(session)
        query_and_update(session)
        trim(session)


_common.write_module_map()
while time.monotonic() < deadline:
    round_once()
