# The answer's form comes from the suite (fields["answer_form"], declared or inferred from its
# training targets); a task without one falls back to reading its options and wording.
import re as _ecd_re

_ECD_SHAPES = ("choice", "word_list", "boolean", "number", "text")
_ECD_FORMS = {"choice": "choice", "yes_no": "boolean", "true_false": "boolean", "integer": "number",
              "decimal": "number", "list": "word_list", "json": "text", "text": "text"}
_ECD_NUM = r"[-+]?\$?\d[\d,]*(?:\.\d+)?"


def ecd_form(task):
    form = (task.get("fields") or {}).get("answer_form") or {}
    return {"kind": form} if isinstance(form, str) else dict(form)


def ecd_answer_shape(task):
    kind = ecd_form(task).get("kind")
    if kind in _ECD_FORMS:
        return "choice" if task.get("choices") or ecd_form(task).get("labels") else _ECD_FORMS[kind]
    declared = str((task.get("fields") or {}).get("answer_format", "")).lower()
    if declared in _ECD_SHAPES:
        return declared
    text = str(task.get("input", ""))
    if task.get("choices"):
        return "choice"
    if _ecd_re.search(r"\b(sort\w*|alphabeti\w*|dictionary order)\b", text, _ecd_re.I):
        return "word_list"
    if _ecd_re.search(r"\b(True|False)\b", text):
        return "boolean"
    if _ecd_re.search(r"\bhow (many|much|old|long|far)\b|\bnumber of\b", text, _ecd_re.I):
        return "number"
    return "text"


def ecd_letters(task):
    return [chr(ord("A") + i) for i in range(len(task.get("choices") or []))]


def ecd_options(task):
    return [str(c).strip() for c in task.get("choices") or ecd_form(task).get("labels") or []]


def ecd_booleans(task):
    kind = ecd_form(task).get("kind")
    return ("Yes", "No") if kind == "yes_no" else ("True", "False")


def ecd_input_words(task):
    return {w.lower() for w in _ecd_re.findall(r"[A-Za-z]+", str(task.get("input", "")))}


def ecd_first_line(text):
    for line in str(text or "").splitlines():
        if line.strip():
            return line.strip()
    return ""


def ecd_says(text, phrase):
    # `phrase` as a whole in `text`: not inside a longer word or number.
    phrase = str(phrase).strip()
    if not phrase:
        return []
    pattern = (r"(?<![\w.])" if phrase[0].isalnum() else "") + _ecd_re.escape(phrase)
    pattern += r"(?!\w|[.,]\d)" if phrase[-1].isalnum() else ""
    return [m.start() for m in _ecd_re.finditer(pattern, str(text), _ecd_re.I)]


def ecd_marked_all(text):
    # Everything the reply marks as its answer, in order: \boxed{...} (those alone when there are
    # any), else each "answer is ..." or "Answer: ..." up to the end of its line.
    text = str(text or "")
    found = _ecd_re.findall(r"\\boxed\{([^{}]*)\}", text)
    if not found:
        found = _ecd_re.findall(r"\banswer(?:\s+is|\s*[:=])\s*[:\-]?\s*(.+)", text, _ecd_re.I)
    out = []
    for answer in found:
        answer = answer.strip().strip("*").strip()
        out.append(answer[:-1].rstrip() if answer.endswith(".") and not answer.endswith("..") else answer)
    return [a for a in out if a]


def ecd_marked(text):
    # The last answer the reply marks as its answer, else "".
    marked = ecd_marked_all(text)
    return marked[-1] if marked else ""


def _ecd_option_of(text, task):
    # The option a short text names: its letter ("B", "(B)", "B."), its text, or both ("B. Yes").
    text = str(text or "").strip().strip("*").rstrip(".").strip()
    letters, options = ecd_letters(task), ecd_options(task)
    match = _ecd_re.fullmatch(r"\(?([A-Z])\)?[.):]?(?:\s+(.*))?", text)
    if match and match.group(1) in letters:
        index = letters.index(match.group(1))
        rest = (match.group(2) or "").strip().rstrip(".").lower()
        if not rest or rest == options[index].lower():
            return letters[index]
    lowered = [o.lower() for o in options]
    if text.lower() in lowered:
        index = lowered.index(text.lower())
        return letters[index] if letters else options[index]
    return ""


def ecd_bare(answer, task):
    # Is `answer` already nothing but an answer of the task's form?
    text = str(answer or "").strip()
    text = text[:-1].strip() if text.endswith(".") else text
    shape = ecd_answer_shape(task)
    if not text:
        return False
    if shape == "number":
        return bool(_ecd_re.fullmatch(_ECD_NUM + "%?", text))
    if shape == "boolean":
        return text.lower() in ("true", "false", "yes", "no")
    if shape == "choice":
        return bool(_ecd_option_of(text, task))
    if shape == "word_list":
        if ecd_form(task).get("bracketed"):
            return bool(_ecd_re.fullmatch(r"\[[^\[\]]*\]", text))
        words = text.split()
        return len(words) >= 2 and all(w.isalpha() and w.lower() in ecd_input_words(task) for w in words)
    return True


def _ecd_plain_number(found):
    return found.replace("$", "").rstrip(".,").replace(",", "")


def _ecd_number(text):
    # The last number the reply's last line states as a result: not a list item's number ("8. "),
    # not an operand of an unfinished sum ("1 + 2 + 3"); else nothing.
    lines = [line for line in str(text).splitlines() if line.strip()]
    last = lines[-1] if lines else ""
    found = ""
    for m in _ecd_re.finditer(_ECD_NUM, last):
        before, after = last[:m.start()].rstrip(), last[m.end():].lstrip()
        listed = not before.strip("*#- ") and after[:1] in (".", ")")
        operand = before[-1:] in ("+", "-", "*", "/", "\u00d7") or after[:1] in ("+", "*", "/", "\u00d7")
        if not listed and not operand:
            found = m.group(0)
    return _ecd_plain_number(found)


def _ecd_boolean(text, task):
    words = ecd_booleans(task)
    for source in (ecd_first_line(text), str(text)):
        found = sorted((at, w) for w in words for at in ecd_says(source, w))
        if found:
            return found[-1][1]
    return ""


def _ecd_named(text, task):
    # The option a marked answer names: "B", "B. text", the text; a letter followed by the text
    # of another option names none (the reply contradicts itself).
    text = str(text or "").strip()
    named = _ecd_option_of(text, task)
    if named or not ecd_letters(task):
        return named
    match = _ecd_re.match(r"\(?([A-Z])\)?(?:[.):,]|\s|$)\s*(.*)", text, _ecd_re.S)
    if not match or match.group(1) not in ecd_letters(task):
        return ""
    rest = match.group(2).strip().rstrip(".").lower()
    if any(rest == option.lower() for option in ecd_options(task)):
        return ""
    return match.group(1)


def _ecd_echo(text, task):
    # Does the reply open by listing the options back ("A. ...", "B. ...") instead of answering?
    letters = ecd_letters(task)
    lines = [line.strip() for line in str(text).splitlines() if line.strip()][:len(letters)]
    return len(letters) >= 2 and sum(bool(_ecd_option_of(line, task)) for line in lines) >= 2


def _ecd_choice(text, task):
    letters = ecd_letters(task)
    if letters and not _ecd_echo(text, task):
        span = "".join(letters)
        tagged = _ecd_re.findall(r"\(([" + span + r"])\)|^\s*(\(?[" + span + r"]\)?(?:[.):]|\s*$).*)$", str(text), _ecd_re.M)
        named = [a or _ecd_named(b, task) for a, b in tagged]
        if named:
            return named[-1]
    # An option named by its text, as a whole phrase, and only when the reply names just one.
    named = {i for i, option in enumerate(ecd_options(task)) if ecd_says(text, option)}
    if len(named) == 1:
        index = named.pop()
        return letters[index] if letters else ecd_options(task)[index]
    return ""


def _ecd_words(text, task):
    if ecd_form(task).get("bracketed"):
        found = _ecd_re.findall(r"\[[^\[\]]*\]", ecd_marked(text) or str(text))
        return found[-1] if found else ""
    allowed = ecd_input_words(task)
    best = []
    for line in text.splitlines():
        words = _ecd_re.findall(r"[A-Za-z]+", line.rsplit(":", 1)[-1])
        if len(words) >= 2 and len(words) > len(best) and all(w.lower() in allowed for w in words):
            best = words
    items = [_ecd_re.sub(r"^\s*(\d+[.)]|[-*\u2022])\s*", "", line).strip().rstrip(".,")
             for line in text.splitlines()]
    listed = [w for w in items if w.isalpha() and w.lower() in allowed]
    return " ".join(listed if len(listed) > len(best) else best)


def ecd_find_answer(text, task):
    # The answer of the task's form found in a reply, or "" when there is none (never a guess):
    # what the reply marks as its answer first, then a bare first line, then the form's own cues.
    text = str(text or "")
    shape = ecd_answer_shape(task)
    marked = ecd_marked(text)
    if marked:
        if shape == "choice":
            # A reply that marks several different options as "the answer" has given none.
            named = {_ecd_named(m, task) for m in ecd_marked_all(text)}
            return _ecd_named(marked, task) if len(named) == 1 else ""
        if shape == "number":
            numbers = _ecd_re.findall(_ECD_NUM, marked)
            if numbers:
                return _ecd_plain_number(numbers[-1])
        elif shape == "boolean":
            found = _ecd_boolean(marked, task)
            if found:
                return found
        elif shape == "word_list":
            found = _ecd_words(marked, task)
            if found:
                return found
        else:
            return marked
    first = ecd_first_line(text)
    if shape != "text" and ecd_bare(first, task) and not (shape == "choice" and _ecd_echo(text, task)):
        first = first.rstrip(".").strip()
        return _ecd_option_of(first, task) if shape == "choice" else first
    if shape == "number":
        return _ecd_number(text)
    if shape == "boolean":
        return _ecd_boolean(text, task)
    if shape == "choice":
        return _ecd_choice(text, task)
    if shape == "word_list":
        return _ecd_words(text, task)
    return ""


def ecd_format_request(task):
    shape = ecd_answer_shape(task)
    wanted = {"number": "only the final number",
              "boolean": "only " + " or ".join(ecd_booleans(task)),
              "choice": ("only the letter of the correct option (" + ", ".join(ecd_letters(task)) + ")"
                         if ecd_letters(task) else "only one of: " + ", ".join(ecd_options(task))),
              "word_list": "only the words, in the required order, separated by single spaces",
              }.get(shape, "only the final answer")
    return "Reply with " + wanted + ", on one line, with no explanation."
