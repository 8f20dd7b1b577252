#!/usr/bin/env python3
"""Generates data/instructions/train.jsonl, a small Dolly-format instruction
set written for the tpu_dist project (see README.md in this folder).

Every record is built from templates and word lists in this file, with a
fixed random seed, so the output is byte-for-byte reproducible:

    python3 data/instructions/generate.py            # rewrites train.jsonl
    python3 data/instructions/generate.py --output /tmp/x.jsonl

Standard library only.
"""

import argparse
import json
import os
import random

SEED = 20261202

# ---------------------------------------------------------------- word lists
NAMES = ["Ada", "Bruno", "Chen", "Dara", "Elif", "Femi", "Greta", "Hiro",
         "Ines", "Jonas", "Kemal", "Lena", "Mateo", "Nadia", "Omar", "Priya",
         "Quinn", "Rosa", "Sven", "Tala", "Uma", "Viktor", "Wen", "Yara"]
PLACES = ["market", "library", "harbor", "bakery", "museum", "park",
          "station", "garden", "workshop", "cafe"]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday",
        "Sunday"]
ITEMS = ["a blue kite", "fresh bread", "a map of the city", "two oranges",
         "a wooden box", "a pair of gloves", "a small lamp", "a notebook",
         "a jar of honey", "a red umbrella"]
COLORS = ["red", "green", "blue", "yellow", "purple", "orange", "white",
          "black"]
ANIMALS = {
    "dog": "mammal", "cat": "mammal", "horse": "mammal", "whale": "mammal",
    "bat": "mammal", "rabbit": "mammal", "goat": "mammal", "otter": "mammal",
    "sparrow": "bird", "eagle": "bird", "penguin": "bird", "owl": "bird",
    "parrot": "bird", "swan": "bird", "crow": "bird", "heron": "bird",
    "salmon": "fish", "trout": "fish", "tuna": "fish", "cod": "fish",
    "carp": "fish", "shark": "fish", "herring": "fish", "perch": "fish",
}
PRODUCE = {
    "apple": "fruit", "banana": "fruit", "cherry": "fruit", "mango": "fruit",
    "pear": "fruit", "plum": "fruit", "grape": "fruit", "lemon": "fruit",
    "carrot": "vegetable", "potato": "vegetable", "spinach": "vegetable",
    "onion": "vegetable", "cabbage": "vegetable", "leek": "vegetable",
    "celery": "vegetable", "radish": "vegetable",
}
POSITIVE = [
    "I loved every minute of the concert.",
    "The new bridge makes my commute so much easier.",
    "What a wonderful surprise this morning was.",
    "The soup was warm and delicious.",
    "Our team finally won the championship!",
    "The teacher explained the lesson beautifully.",
    "This little phone works perfectly.",
    "The hotel staff were kind and helpful.",
    "I am thrilled with how the garden turned out.",
    "The test finished in record time and every check passed.",
    "The sunrise over the lake was breathtaking.",
    "My friends threw me a fantastic birthday party.",
    "The training loss went down smoothly all night.",
    "This book made me smile from start to end.",
    "The repair was quick and the price was fair.",
]
NEGATIVE = [
    "The train was late again and nobody told us why.",
    "I regret buying this chair; it broke in a week.",
    "The movie was long, loud and boring.",
    "Our flight was cancelled and the queue never moved.",
    "The bread was stale and the coffee was cold.",
    "The build failed three times for no clear reason.",
    "My umbrella snapped in the first gust of wind.",
    "The service at that restaurant was rude and slow.",
    "I lost my keys and missed the bus.",
    "The printer jams every single time I use it.",
    "The rain ruined our picnic completely.",
    "The update deleted all of my settings.",
    "The hike was muddy, cold and miserable.",
    "That game crashes whenever I open the menu.",
    "The noise from the street kept me awake all night.",
]
DEFINITIONS = {
    "harbor": "a sheltered area of water where ships can stay safely",
    "glacier": "a slow-moving mass of ice formed from compacted snow",
    "orchard": "a piece of land planted with fruit trees",
    "lantern": "a portable lamp with a protective case around the light",
    "compass": "a tool with a magnetic needle that points north",
    "meadow": "a field of grass and wild flowers",
    "anchor": "a heavy object that holds a ship in place",
    "recipe": "a list of ingredients and steps for making a dish",
    "volcano": "a mountain that can release lava, ash and gas",
    "archive": "a collection of old records kept for reference",
    "bridge": "a structure that carries a path over an obstacle",
    "canyon": "a deep valley with steep sides, often cut by a river",
    "ledger": "a book or file in which accounts are recorded",
    "puzzle": "a game or problem that tests cleverness",
    "harvest": "the gathering of ripe crops from the fields",
    "telescope": "an instrument that makes distant objects look nearer",
    "fossil": "the preserved remains or trace of an ancient living thing",
    "island": "a piece of land surrounded by water",
    "quarry": "a place where stone is dug out of the ground",
    "tide": "the regular rise and fall of the sea level",
    "shard": "a piece of a larger whole; in tpu_dist, the slice of a tensor held by one rank",
    "checkpoint": "a saved copy of a training run's state that lets it resume",
    "gradient": "the direction and rate of fastest increase of a function",
    "epoch": "one full pass of training over the dataset",
    "batch": "a group of examples processed together in one training step",
    "token": "a small unit of text, such as a word piece, that a model reads",
    "tensor": "a multi-dimensional array of numbers",
    "optimizer": "the algorithm that updates model weights from gradients",
    "barrier": "a point where every process waits until all have arrived",
    "rank": "the index of one process within a distributed job",
    "all-reduce": "a collective operation that combines values from every rank and gives the result to all",
    "learning rate": "the size of the step an optimizer takes along the gradient",
    "loss": "a number that measures how wrong a model's predictions are",
    "padding": "filler tokens added so that all sequences have the same length",
    "tokenizer": "a program that turns text into a sequence of token ids",
    "latency": "the time between a request and its response",
    "throughput": "the amount of work done per unit of time",
    "heartbeat": "a periodic signal that shows a process is still alive",
    "mesh": "an arrangement of devices along named axes",
    "sampler": "the component that decides which examples each rank reads",
}
PROJECT_FACTS = [
    ("What is tpu_dist?",
     "tpu_dist is a C++17 distributed training runtime built on libtorch, modelled on TorchTPU and Ray Train."),
    ("Which language is tpu_dist written in?",
     "tpu_dist is written in C++17."),
    ("Which tensor library does tpu_dist use?",
     "tpu_dist uses libtorch 1.13."),
    ("What does the tpurun launcher do?",
     "tpurun starts one process per device, emulates hosts, detects failures and restarts the job."),
    ("What does the coordination service provide?",
     "The coordination service provides a key-value store, barriers and heartbeats over gRPC."),
    ("What is FullyShard in tpu_dist?",
     "FullyShard shards a model's parameters across ranks, in the manner of FSDP."),
    ("How many devices does the Gemma fine-tune use?",
     "The Gemma fine-tune runs across 16 devices."),
    ("Which model does the fine-tune example train?",
     "The fine-tune example trains a Gemma 4 text decoder."),
    ("Where are checkpoints stored?",
     "Checkpoints are stored under <storage-path>/<run-name>/checkpoint_<timestamp>/."),
    ("What file marks a checkpoint as complete?",
     "A checkpoint is complete when its checkpoint.json is present, says complete is true, and lists files whose sizes match."),
    ("What does the DistributedSampler do?",
     "It gives each rank a disjoint, shuffled shard of the dataset every epoch."),
    ("What is written to metrics.jsonl?",
     "One JSON line per epoch with epoch, loss, epoch_time_s, tokens_per_s, steps and timestamp."),
    ("Which transports do the collectives use?",
     "Shared memory within a host and TCP between hosts."),
    ("What are the two seed slices of tpu_dist?",
     "A v6e 4x4 slice and a TPU7x 2x2x2 slice, each with 16 devices."),
    ("Which label marks padded positions in the fine-tune?",
     "Padded positions get the label -100, which the loss ignores."),
    ("Which pad, end and begin token ids does the Gemma tokenizer use?",
     "Pad is 0, end of sequence is 1 and begin of sequence is 2."),
    ("How is tokens per second computed in the fine-tune?",
     "Steps times global batch size times sequence length, divided by the epoch time."),
    ("What does the tpu_dist process group implement?",
     "It implements the c10d process group interface for tpu_dist's collectives."),
    ("What error type does tpu_dist use inside its libraries?",
     "It uses absl::Status and absl::StatusOr, with exceptions only at the torch boundary."),
    ("What does a DeviceMesh describe?",
     "A DeviceMesh arranges ranks along named axes, such as data and tensor parallel."),
]
GENERAL_QA = [
    ("Why do we water plants?",
     "Plants need water to move nutrients, keep their cells firm and make food through photosynthesis."),
    ("Why is the sky blue?",
     "Air scatters blue sunlight more than red light, so blue light reaches our eyes from every direction."),
    ("Why do people save copies of important work?",
     "A saved copy lets you recover if something breaks, so you do not have to start over."),
    ("How can I sleep better?",
     "Keep a regular bedtime, avoid screens late at night, and keep the room dark and cool."),
    ("Why do ships float?",
     "A ship pushes aside water that weighs as much as the ship, and that water pushes it up."),
    ("How do I make tea?",
     "Boil water, pour it over a tea bag or leaves, wait a few minutes and remove the tea."),
    ("Why should code have tests?",
     "Tests catch mistakes early and let you change code with confidence."),
    ("How can I learn a new language?",
     "Practice a little every day, listen to native speakers and try to speak from the start."),
    ("Why do leaves change color in autumn?",
     "Trees stop making green chlorophyll, so the yellow and red pigments show through."),
    ("Why do we shuffle training data?",
     "Shuffling stops the model from learning the order of the examples and makes each batch more representative."),
    ("Why does a distributed job need a barrier?",
     "A barrier makes sure every process has finished a phase before any of them starts the next."),
    ("How do I keep a bicycle in good shape?",
     "Keep the chain clean and oiled, check the tire pressure and test the brakes often."),
    ("Why do we pad sequences in a batch?",
     "Tensors need a rectangular shape, so shorter sequences are padded to the longest length."),
    ("Why is exercise good for you?",
     "Exercise strengthens the heart and muscles, improves mood and helps you sleep."),
    ("How can I save money on groceries?",
     "Plan meals, make a list, buy seasonal produce and avoid shopping when hungry."),
    ("Why do bread doughs rise?",
     "Yeast eats sugar and releases gas, which gets trapped in the dough and makes it rise."),
    ("Why should a program time out instead of waiting forever?",
     "A timeout turns a silent hang into a clear error that can be reported and handled."),
    ("How do I write a good commit message?",
     "Start with a short summary of what changed, then explain why in a few plain sentences."),
    ("Why do birds migrate?",
     "Many birds fly to warmer places in winter to find food and safe places to breed."),
    ("How can I remember things better?",
     "Review them several times spread over days, and explain them to someone else."),
    ("Why does ice float on water?",
     "Water expands when it freezes, so ice is less dense than liquid water."),
    ("Why do we checkpoint long training runs?",
     "If a machine fails, the run can resume from the last checkpoint instead of starting again."),
    ("How do I plan a short trip?",
     "Pick dates, book a place to stay, check the transport and pack only what you need."),
    ("Why do we wash our hands?",
     "Washing removes germs that could make us or others sick."),
    ("Why is it useful to measure throughput?",
     "Throughput shows how much work a system does per second, so you can spot slowdowns."),
]
TOPICS = ["the sea", "a quiet library", "autumn rain", "a mountain path",
          "a city at night", "an old clock", "a garden in spring",
          "a train journey", "the first snow", "a lighthouse"]
BRAIN_TOPICS = [
    ("names for a pet cat", ["Miso", "Pepper", "Luna", "Biscuit", "Shadow", "Clementine", "Pixel", "Mochi"]),
    ("names for a bakery", ["The Rolling Pin", "Crumb and Crust", "Morning Loaf", "Sweet Oven", "Flour Power", "Golden Crumb"]),
    ("things to pack for a beach day", ["sunscreen", "a towel", "water", "a hat", "snacks", "a book", "sunglasses"]),
    ("indoor activities for a rainy day", ["bake cookies", "play a board game", "read a book", "build a blanket fort", "paint", "do a puzzle"]),
    ("ways to speed up a slow training job", ["use a larger batch", "overlap communication with compute", "shard the optimizer state", "profile the slowest step", "cache the tokenized data"]),
    ("ideas for a science fair project", ["grow plants under colored light", "build a water filter", "measure how fast ice melts", "make a simple electric motor", "test which paper airplane flies farthest"]),
    ("healthy breakfast ideas", ["oatmeal with fruit", "yogurt with nuts", "eggs on toast", "a banana smoothie", "whole grain cereal"]),
    ("ways to reduce waste at home", ["compost food scraps", "use cloth bags", "repair instead of replace", "buy in bulk", "reuse glass jars"]),
    ("names for a small robot", ["Bolt", "Widget", "Sprocket", "Echo", "Tinker", "Gizmo", "Rivet"]),
    ("checks to run before a long training job", ["test on a tiny model", "verify the checkpoint restores", "check the loss goes down", "confirm every rank sees the data", "set timeouts on every wait"]),
    ("hobbies to try this year", ["pottery", "bird watching", "rock climbing", "learning the guitar", "knitting", "photography"]),
    ("games to play at a party", ["charades", "musical chairs", "a treasure hunt", "twenty questions", "pictionary"]),
]
UNITS = [
    ("kilometers", "meters", 1000), ("meters", "centimeters", 100),
    ("kilograms", "grams", 1000), ("liters", "milliliters", 1000),
    ("hours", "minutes", 60), ("minutes", "seconds", 60),
    ("days", "hours", 24), ("weeks", "days", 7),
    ("gigabytes", "megabytes", 1024), ("kilobytes", "bytes", 1024),
]

# ------------------------------------------------------------ generators


def rec(instruction, context, response, category):
    return {"instruction": instruction, "context": context,
            "response": response, "category": category}


def arithmetic(rng):
    a, b = rng.randint(2, 99), rng.randint(2, 99)
    op = rng.choice(["plus", "minus", "times"])
    if op == "plus":
        r = a + b
    elif op == "minus":
        a, b = max(a, b), min(a, b)
        r = a - b
    else:
        a, b = rng.randint(2, 12), rng.randint(2, 12)
        r = a * b
    q = rng.choice(["What is {a} {op} {b}?", "Compute {a} {op} {b}.",
                    "Calculate {a} {op} {b}."]).format(a=a, op=op, b=b)
    return rec(q, "", f"{a} {op} {b} is {r}.", "open_qa")


def conversion(rng):
    big, small, factor = rng.choice(UNITS)
    n = rng.randint(2, 40)
    q = rng.choice(["How many {s} are in {n} {b}?",
                    "Convert {n} {b} to {s}."]).format(s=small, n=n, b=big)
    return rec(q, "", f"{n} {big} is {n * factor} {small}.", "open_qa")


def definition(rng):
    word, meaning = rng.choice(sorted(DEFINITIONS.items()))
    form = rng.randrange(3)
    if form == 0:
        q, r = f"What does the word \"{word}\" mean?", f"\"{word}\" means {meaning}."
    elif form == 1:
        q, r = f"Define \"{word}\".", f"\"{word}\": {meaning}."
    else:
        q, r = f"What is meant by \"{word}\"?", f"\"{word}\" is {meaning}."
    return rec(q, "", r, "open_qa")


def project_fact(rng):
    q, a = rng.choice(PROJECT_FACTS)
    prefix = rng.choice(["", "Quick question: ", "Tell me: ", "In tpu_dist, "])
    if prefix == "In tpu_dist, ":
        q = q[0].lower() + q[1:]
    return rec(prefix + q, "", a, "open_qa")


def closed_story(rng):
    name = rng.choice(NAMES)
    a, b = rng.randint(1, 9), rng.randint(1, 9)
    thing = rng.choice(["apples", "books", "stamps", "marbles", "shells"])
    ctx = (f"{name} had {a} {thing}. On {rng.choice(DAYS)}, {name} found "
           f"{b} more {thing} at the {rng.choice(PLACES)}.")
    return rec(f"How many {thing} does {name} have now?", ctx,
               f"{name} has {a + b} {thing}.", "closed_qa")


def closed_list(rng):
    nums = rng.sample(range(1, 100), rng.randint(4, 7))
    task = rng.choice(["ascending", "descending", "reverse", "largest",
                       "smallest"])
    ctx = ", ".join(map(str, nums))
    if task == "ascending":
        q, r = "Sort the numbers in ascending order.", ", ".join(map(str, sorted(nums)))
    elif task == "descending":
        q, r = "Sort the numbers in descending order.", ", ".join(map(str, sorted(nums, reverse=True)))
    elif task == "reverse":
        q, r = "Reverse the order of the list.", ", ".join(map(str, reversed(nums)))
    elif task == "largest":
        q, r = "Which number in the list is the largest?", f"The largest number is {max(nums)}."
    else:
        q, r = "Which number in the list is the smallest?", f"The smallest number is {min(nums)}."
    return rec(q, ctx, r, "closed_qa")


def closed_words(rng):
    words = rng.sample(sorted(DEFINITIONS), rng.randint(3, 6))
    words = [w for w in words if " " not in w and "-" not in w][:5]
    if len(words) < 2:
        words = ["meadow", "anchor", "tide"]
    ctx = ", ".join(words)
    if rng.random() < 0.5:
        return rec("Sort these words alphabetically.", ctx,
                   ", ".join(sorted(words)), "closed_qa")
    return rec("Write each word backwards.", ctx,
               ", ".join(w[::-1] for w in words), "closed_qa")


def general(rng):
    q, a = rng.choice(GENERAL_QA)
    lead = rng.choice(["", "Can you explain: ", "I wonder: ", "Please answer: "])
    if lead:
        q = lead + q[0].lower() + q[1:]
    return rec(q, "", a, "general_qa")


def classify_sentiment(rng):
    pos = rng.random() < 0.5
    s = rng.choice(POSITIVE if pos else NEGATIVE)
    q = rng.choice(["Is the sentiment of this sentence positive or negative?",
                    "Classify the sentence as positive or negative."])
    return rec(q, s, "Positive." if pos else "Negative.", "classification")


def classify_animal(rng):
    names = rng.sample(sorted(ANIMALS), 4)
    q = "Classify each animal as a mammal, bird or fish: " + ", ".join(names) + "."
    r = "; ".join(f"{n} is a {ANIMALS[n]}" for n in names) + "."
    return rec(q, "", r[0].upper() + r[1:], "classification")


def classify_produce(rng):
    names = rng.sample(sorted(PRODUCE), 4)
    q = "Which of these are fruits and which are vegetables: " + ", ".join(names) + "?"
    fruits = [n for n in names if PRODUCE[n] == "fruit"]
    vegs = [n for n in names if PRODUCE[n] == "vegetable"]
    parts = []
    parts.append("Fruits: " + (", ".join(fruits) if fruits else "none"))
    parts.append("Vegetables: " + (", ".join(vegs) if vegs else "none"))
    return rec(q, "", ". ".join(parts) + ".", "classification")


def classify_parity(rng):
    n = rng.randint(1, 999)
    return rec(f"Is {n} even or odd?", "",
               f"{n} is {'even' if n % 2 == 0 else 'odd'}.", "classification")


def brainstorm(rng):
    topic, pool = rng.choice(BRAIN_TOPICS)
    k = rng.randint(3, min(5, len(pool)))
    picks = rng.sample(pool, k)
    q = rng.choice(["Give me {k} {t}.", "List {k} {t}.",
                    "Brainstorm {k} {t}."]).format(k=k, t=topic)
    return rec(q, "", "\n".join(f"- {p}" for p in picks), "brainstorming")


def extract_meeting(rng):
    name = rng.choice(NAMES)
    day = rng.choice(DAYS)
    hour = rng.randint(8, 17)
    room = rng.randint(1, 40)
    ctx = (f"Hi team, {name} here. Our planning meeting moves to {day} at "
           f"{hour}:00 in room {room}. Please bring your notes.")
    what = rng.choice(["day", "time", "room", "organizer"])
    if what == "day":
        return rec("On which day is the meeting?", ctx, f"{day}.", "information_extraction")
    if what == "time":
        return rec("At what time is the meeting?", ctx, f"{hour}:00.", "information_extraction")
    if what == "room":
        return rec("In which room is the meeting?", ctx, f"Room {room}.", "information_extraction")
    return rec("Who sent this message?", ctx, f"{name}.", "information_extraction")


def extract_numbers(rng):
    name = rng.choice(NAMES)
    a, b = rng.randint(2, 50), rng.randint(2, 50)
    c = rng.choice(COLORS)
    ctx = (f"{name} painted {a} fences {c} and then spent {b} minutes "
           f"cleaning the brushes.")
    return rec("Extract all the numbers from the text.", ctx,
               f"{a}, {b}", "information_extraction")


def extract_names(rng):
    a, b = rng.sample(NAMES, 2)
    place = rng.choice(PLACES)
    ctx = f"After lunch, {a} walked to the {place} with {b} to buy {rng.choice(ITEMS)}."
    return rec("List the people mentioned in the text.", ctx,
               f"{a} and {b}.", "information_extraction")


def summarize(rng):
    name = rng.choice(NAMES)
    place = rng.choice(PLACES)
    day = rng.choice(DAYS)
    item = rng.choice(ITEMS)
    color = rng.choice(COLORS)
    ctx = (f"On {day} morning, {name} left home early. The streets were quiet "
           f"and the sky was {color} with dawn. {name} walked to the {place}, "
           f"looked around for a while, and finally bought {item}. "
           f"Happy with the find, {name} went home before noon.")
    q = rng.choice(["Summarize the text in one sentence.",
                    "Give a one-sentence summary of this passage."])
    return rec(q, ctx, f"On {day}, {name} went to the {place} and bought {item}.",
               "summarization")


def summarize_run(rng):
    epochs = rng.randint(2, 5)
    start = round(rng.uniform(2.5, 4.0), 2)
    end = round(start - rng.uniform(0.5, 2.0), 2)
    devices = rng.choice([4, 8, 16])
    ctx = (f"The fine-tune ran for {epochs} epochs on {devices} devices. "
           f"The loss started at {start} and ended at {end}. One checkpoint was "
           f"written after each epoch and the best one was kept.")
    return rec("Summarize this training report.", ctx,
               f"A {epochs}-epoch run on {devices} devices lowered the loss from {start} to {end}.",
               "summarization")


def creative(rng):
    topic = rng.choice(TOPICS)
    color = rng.choice(COLORS)
    kind = rng.choice(["haiku", "story", "couplet"])
    if kind == "haiku":
        q = f"Write a haiku about {topic}."
        r = f"Soft light on {topic}\n{color} shadows drift and fade\nthe day breathes slowly"
    elif kind == "story":
        name = rng.choice(NAMES)
        animal = rng.choice(sorted(ANIMALS))
        q = f"Write a two-sentence story about a {animal} named {name}."
        r = (f"{name} the {animal} spent every evening dreaming of {topic}. "
             f"One {color} morning, {name} set out to find it and never looked back.")
    else:
        q = f"Write a rhyming couplet about {topic}."
        r = f"I went to see {topic} one day,\nand {color} skies came out to play."
    return rec(q, "", r, "creative_writing")


GENERATORS = [
    (arithmetic, 200), (conversion, 120), (definition, 80), (project_fact, 60),
    (closed_story, 100), (closed_list, 120), (closed_words, 60),
    (general, 90), (classify_sentiment, 90), (classify_animal, 60),
    (classify_produce, 60), (classify_parity, 60), (brainstorm, 110),
    (extract_meeting, 80), (extract_numbers, 50), (extract_names, 50),
    (summarize, 80), (summarize_run, 50), (creative, 120),
]


def generate():
    rng = random.Random(SEED)
    seen = set()
    out = []
    for fn, target in GENERATORS:
        made, attempts = 0, 0
        while made < target and attempts < target * 50:
            attempts += 1
            r = fn(rng)
            key = (r["instruction"], r["context"])
            if key in seen:
                continue
            seen.add(key)
            out.append(r)
            made += 1
    rng.shuffle(out)
    return out


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--output", default=os.path.join(here, "train.jsonl"))
    args = p.parse_args()
    rows = generate()
    with open(args.output, "w", encoding="utf-8", newline="\n") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    print(f"wrote {len(rows)} records to {args.output}")


if __name__ == "__main__":
    main()
