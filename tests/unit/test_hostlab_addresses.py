"""hostlab's fixed host addresses: one per host for life, unmoved by other hosts."""
from __future__ import annotations

import ipaddress

import pytest
from by_path import load

hostlab = load("hostlab_cli", "hostlab/hostlab.py")
STOCK = ["ctl", "db", "login", "cpu1", "gpu1", "gpu2"]


def test_every_host_gets_its_own_address_in_the_subnet_above_the_gateway() -> None:
    got = hostlab.addresses(STOCK)
    assert sorted(got) == sorted(STOCK) and len(set(got.values())) == len(STOCK)
    net = ipaddress.ip_network("10.89.77.0/24")
    assert all(ipaddress.ip_address(a) in net and int(a.split(".")[-1]) >= 10 for a in got.values())


def test_adding_or_removing_hosts_moves_no_other_host() -> None:
    stock = hostlab.addresses(STOCK)
    more = hostlab.addresses([*STOCK, *(f"cpu{i}" for i in range(2, 40))])
    assert {h: more[h] for h in STOCK} == stock
    fewer = hostlab.addresses([h for h in STOCK if h != "gpu2"])
    assert fewer == {h: a for h, a in stock.items() if h != "gpu2"}


def test_clashing_names_each_get_a_free_address_in_a_small_subnet() -> None:
    small = ipaddress.ip_network("10.0.0.0/28")  # room for 5 hosts
    got = hostlab.addresses(["a", "b", "c", "d", "e"], small)
    assert len(set(got.values())) == 5


def test_more_hosts_than_the_subnet_holds_is_one_line() -> None:
    with pytest.raises(hostlab.HostlabError, match=r"hosts: 6 hosts do not fit subnet 10.0.0.0/28"):
        hostlab.addresses(["a", "b", "c", "d", "e", "f"], ipaddress.ip_network("10.0.0.0/28"))


def test_each_host_gets_a_fixed_unicast_locally_administered_mac_from_its_address() -> None:
    got = hostlab.addresses([*STOCK, *(f"cpu{i}" for i in range(2, 40))])
    macs = {host: hostlab.mac_address(address) for host, address in got.items()}
    assert len(set(macs.values())) == len(macs)  # one per host, as the addresses are
    first = {int(mac.split(":")[0], 16) for mac in macs.values()}
    assert first == {0x02}  # locally administered (bit 1), unicast (bit 0 clear)
    assert hostlab.mac_address("10.89.77.208") == "02:42:0a:59:4d:d0"
    assert hostlab.mac_address(got["cpu1"]) == hostlab.mac_address(hostlab.addresses(STOCK)["cpu1"])
