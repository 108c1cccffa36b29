"""The Nexmark event generator (persons, auctions, bids), seeded, after the model of Apache Beam's and the
nexmark/nexmark project's generators (GeneratorConfig, PersonGenerator, AuctionGenerator, BidGenerator,
PriceGenerator, StringsGenerator with their default NexmarkConfiguration), written anew in Python.

The model, with the default configuration:

- **Event numbers and kinds.** Event n (0, 1, 2, ...) is, by n mod 50: 0 a person, 1-3 an auction, 4-49 a bid
  (personProportion 1, auctionProportion 3, bidProportion 46).
- **Event time** advances at a fixed rate: event n happens at base + floor(n * (10^6 / rate) / 1000) ms (the
  generator's interEventDelayUs; rate 10,000 events per event-second by default, firstEventRate). Events come
  out in event-number order (outOfOrderGroupSize 1), so event time never goes back.
- **Ids.** Person ids and auction ids are dense and start at 1000 (FIRST_PERSON_ID, FIRST_AUCTION_ID): the
  person of event n has id 1000 + n // 50, the auctions of epoch e = n // 50 have ids 1000 + 3e + (n mod 50 - 1).
  "The last person (auction)" at event n is the newest one made at or before n.
- **Sellers.** An auction's seller is, with probability 3/4 (hotSellersRatio 4), the hot seller: the first
  person of the last batch of 100 persons; otherwise a person among the last 1,000 (numActivePeople) plus 10
  ids not made yet (PERSON_ID_LEAD: the model lets an auction name its seller before the person event).
- **Bids.** A bid is, with probability 1/2 (hotAuctionRatio 2), for the hot auction: the first of the last
  batch of 100 auctions; otherwise for one of the last 100 auctions (numInFlightAuctions) plus 10 not made yet
  (AUCTION_ID_LEAD). Its bidder is, with probability 3/4 (hotBiddersRatio 4), the hot bidder (the second person
  of the last batch of 100, so hot bidders and hot sellers differ), else an active person as for sellers.
- **Prices** are in cents: round(10^(6u) * 100) for u uniform in [0, 1) (PriceGenerator), so every query's
  arithmetic is on integers. An auction's reserve is its initial bid plus another such price.
- **Expiry.** An auction expires 1 ms to twice the horizon after its dateTime, uniformly, where the horizon is
  the event time that numInFlightAuctions (100) more auctions take to come: it expires after it opened.
- **Categories** 10-14; bids' channels: half of them one of four hot channels (Google, Facebook, Baidu, Apple)
  with one hot URL each, the rest one of 10,000 channels "channel-<i>" with a URL each (a tenth with a
  channel_id parameter); persons' names, cities (10), states (6), e-mails and card numbers from the model's lists.
- **Sizes.** Each event's `extra` pads it to the model's average size (person 200 B, auction 500 B, bid 100 B,
  counted as the Java generator counts them): a string of the remaining length +-20%, cut from one random 1 MiB
  string, as the Java generator's REUSABLE_EXTRA_STRING.

Where this differs from the Java code: the random numbers are Python's Mersenne Twister (random.Random(seed)),
not SplittableRandom, so the same seed gives other events than Java's; and the Flink port adds FIRST_PERSON_ID
twice to a bid's bidder (a slip: bidders then name persons 1,000 ids ahead), which this generator does once, as
Beam does.

Stdlib only. Times are epoch milliseconds.
"""

from __future__ import annotations

import random
import string
from collections.abc import Iterator
from dataclasses import dataclass

PERSON_PROPORTION, AUCTION_PROPORTION, BID_PROPORTION = 1, 3, 46
TOTAL_PROPORTION = PERSON_PROPORTION + AUCTION_PROPORTION + BID_PROPORTION
FIRST_PERSON_ID = 1000
FIRST_AUCTION_ID = 1000
FIRST_CATEGORY_ID = 10
NUM_CATEGORIES = 5
HOT_AUCTION_RATIO, HOT_SELLERS_RATIO, HOT_BIDDERS_RATIO = 2, 4, 4  # the configuration's (NexmarkConfiguration)
HOT_BATCH = 100  # the generators' HOT_*_RATIO constants: hot ids are the first of each batch of 100
NUM_IN_FLIGHT_AUCTIONS = 100
NUM_ACTIVE_PEOPLE = 1000
ID_LEAD = 10  # PERSON_ID_LEAD, AUCTION_ID_LEAD
AVG_PERSON_BYTES, AVG_AUCTION_BYTES, AVG_BID_BYTES = 200, 500, 100
DEFAULT_RATE = 10_000  # firstEventRate: events per event-second

US_STATES = ("AZ", "CA", "ID", "OR", "WA", "WY")
US_CITIES = ("Phoenix", "Los Angeles", "San Francisco", "Boise", "Portland", "Bend", "Redmond", "Seattle", "Kent",
             "Cheyenne")  # fmt: skip
FIRST_NAMES = ("Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie", "Sarah", "Deiter", "Walter")
LAST_NAMES = ("Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith", "Jones", "Noris")
HOT_CHANNELS = ("Google", "Facebook", "Baidu", "Apple")
CHANNELS = 10_000


@dataclass(frozen=True)
class Person:
    id: int
    name: str
    emailAddress: str
    creditCard: str
    city: str
    state: str
    dateTime: int
    extra: str


@dataclass(frozen=True)
class Auction:
    id: int
    itemName: str
    description: str
    initialBid: int
    reserve: int
    dateTime: int
    expires: int
    seller: int
    category: int
    extra: str


@dataclass(frozen=True)
class Bid:
    auction: int
    bidder: int
    price: int
    channel: str
    url: str
    dateTime: int
    extra: str


Event = Person | Auction | Bid


def last_person(n: int) -> int:
    """The base-0 id of the newest person at event n (its own, if n makes one)."""
    return n // TOTAL_PROPORTION * PERSON_PROPORTION + min(n % TOTAL_PROPORTION, PERSON_PROPORTION - 1)


def last_auction(n: int) -> int:
    """The base-0 id of the newest auction at event n (its own, if n makes one)."""
    epoch, offset = divmod(n, TOTAL_PROPORTION)
    if offset < PERSON_PROPORTION:  # a person: the last auction of the epoch before
        epoch, offset = epoch - 1, AUCTION_PROPORTION - 1
    elif offset >= PERSON_PROPORTION + AUCTION_PROPORTION:  # a bid: the last auction of this epoch
        offset = AUCTION_PROPORTION - 1
    else:
        offset -= PERSON_PROPORTION
    return epoch * AUCTION_PROPORTION + offset


class Generator:
    """Nexmark events in event-number order; `rate` events per event-second from `base_ms`."""

    def __init__(self, seed: int, base_ms: int, rate: int = DEFAULT_RATE) -> None:
        self.rng = random.Random(seed)
        self.base_ms = base_ms
        self.rate = rate
        letters = string.ascii_lowercase
        self.reusable = "".join(self.rng.choices(letters, k=1 << 20))
        self.hot_urls = [self._base_url() for _ in HOT_CHANNELS]
        self.channel_urls = []
        for i in range(CHANNELS):
            url = self._base_url()
            if self.rng.randrange(10) > 0:
                # Java's Math.abs(Integer.reverse(i)): the bits of i reversed in 32 bits, as a signed int
                rev = int(f"{i:032b}"[::-1], 2)
                url += f"&channel_id={abs(rev - (1 << 32) if rev >= 1 << 31 else rev)}"
            self.channel_urls.append(url)

    def time_of(self, n: int) -> int:
        """Event n's time: base + n * interEventDelayUs / 1000, rounded down as the Java generator does."""
        return self.base_ms + n * 1_000_000 // self.rate // 1000

    def events(self, count: int) -> Iterator[Event]:
        for n in range(count):
            kind = n % TOTAL_PROPORTION
            ts = self.time_of(n)
            if kind < PERSON_PROPORTION:
                yield self.person(n, ts)
            elif kind < PERSON_PROPORTION + AUCTION_PROPORTION:
                yield self.auction(n, ts)
            else:
                yield self.bid(n, ts)

    # ------------------------------------------------------------ the parts

    def _string(self, max_length: int, special: str = " ") -> str:
        """3 to max_length - 1 characters, a letter or (1 in 13) `special` each, trimmed (nextString)."""
        rng = self.rng
        n = 3 + rng.randrange(max_length - 3)
        return "".join(special if rng.randrange(13) == 0 else chr(97 + rng.randrange(26)) for _ in range(n)).strip()

    def _extra(self, current: int, average: int) -> str:
        """Padding so that current + its length is `average` on average (nextExtra)."""
        if current > average:
            return ""
        want = average - current
        delta = round(want * 0.2)
        size = want - delta + (self.rng.randrange(2 * delta) if delta else 0)
        at = self.rng.randrange(len(self.reusable) - size)
        return self.reusable[at : at + size]

    def _base_url(self) -> str:
        parts = "/".join(self._string(5, "_") for _ in range(3))
        return f"https://www.nexmark.com/{parts}/item.htm?query=1"

    def _price(self) -> int:
        """Cents: round(10^(6u) * 100), u in [0, 1)."""
        return round(10.0 ** (self.rng.random() * 6.0) * 100.0)

    def _active_person(self, n: int) -> int:
        """A random base-0 person id among the active ones, plus a few not made yet (nextBase0PersonId)."""
        people = last_person(n) + 1
        active = min(people, NUM_ACTIVE_PEOPLE)
        return people - active + self.rng.randrange(active + ID_LEAD)

    def _in_flight_auction(self, n: int) -> int:
        """A random base-0 auction id among those likely still open, plus a few not made yet (nextBase0AuctionId)."""
        newest = last_auction(n)
        low = max(newest - NUM_IN_FLIGHT_AUCTIONS, 0)
        return low + self.rng.randrange(newest - low + 1 + ID_LEAD)

    def person(self, n: int, ts: int) -> Person:
        rng = self.rng
        name = f"{rng.choice(FIRST_NAMES)} {rng.choice(LAST_NAMES)}"
        email = f"{self._string(7)}@{self._string(5)}.com"
        card = " ".join(f"{rng.randrange(10_000):04d}" for _ in range(4))
        city, state = rng.choice(US_CITIES), rng.choice(US_STATES)
        size = 8 + len(name) + len(email) + len(card) + len(city) + len(state)
        extra = self._extra(size, AVG_PERSON_BYTES)
        return Person(FIRST_PERSON_ID + last_person(n), name, email, card, city, state, ts, extra)

    def auction(self, n: int, ts: int) -> Auction:
        rng = self.rng
        if rng.randrange(HOT_SELLERS_RATIO) > 0:
            seller = last_person(n) // HOT_BATCH * HOT_BATCH
        else:
            seller = self._active_person(n)
        category = FIRST_CATEGORY_ID + rng.randrange(NUM_CATEGORIES)
        initial = self._price()
        # The horizon: the event time NUM_IN_FLIGHT_AUCTIONS auctions ahead; the length averages it.
        ahead = NUM_IN_FLIGHT_AUCTIONS * TOTAL_PROPORTION // AUCTION_PROPORTION
        horizon = self.time_of(n + ahead) - ts
        expires = ts + 1 + rng.randrange(max(horizon * 2, 1))
        name, description = self._string(20), self._string(100)
        reserve = initial + self._price()
        extra = self._extra(8 + len(name) + len(description) + 40, AVG_AUCTION_BYTES)
        auction_id = FIRST_AUCTION_ID + last_auction(n)
        return Auction(auction_id, name, description, initial, reserve, ts, expires, FIRST_PERSON_ID + seller,
                       category, extra)  # fmt: skip

    def bid(self, n: int, ts: int) -> Bid:
        rng = self.rng
        if rng.randrange(HOT_AUCTION_RATIO) > 0:
            auction = last_auction(n) // HOT_BATCH * HOT_BATCH
        else:
            auction = self._in_flight_auction(n)
        if rng.randrange(HOT_BIDDERS_RATIO) > 0:
            bidder = last_person(n) // HOT_BATCH * HOT_BATCH + 1
        else:
            bidder = self._active_person(n)
        price = self._price()
        if rng.randrange(2) > 0:
            i = rng.randrange(len(HOT_CHANNELS))
            channel, url = HOT_CHANNELS[i], self.hot_urls[i]
        else:
            i = rng.randrange(CHANNELS)
            channel, url = f"channel-{i}", self.channel_urls[i]
        extra = self._extra(32, AVG_BID_BYTES)
        return Bid(FIRST_AUCTION_ID + auction, FIRST_PERSON_ID + bidder, price, channel, url, ts, extra)
