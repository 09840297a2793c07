/* fair: priority, tenant fair share and arrival order for the scheduler (see fair.h). */
#include "fair.h"
#include "../common/cm_err.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

struct ex_fair_tenant {
    uint64_t id;
    uint32_t weight;
    int      n_wait, n_run;
    int64_t  blocks;              /* held by its running items */
    ex_fair_item *head, *tail;    /* waiting, by (priority, arrival) */
    int      live_idx;            /* its index in f->live */
};

struct ex_fair {
    int      max_items, n_items, n_wait;
    double   inv_slots, inv_blocks;
    uint64_t arrivals;
    uint32_t round;
    ex_fair_tenant *tenants;      /* [max_items] storage */
    ex_fair_tenant **live;        /* [max_items] tenants with items, n_live of them */
    ex_fair_tenant **spare;       /* [max_items] unused storage, n_spare of them */
    int      n_live, n_spare;
};

int ex_fair_create(int max_items, int run_slots, int kv_blocks, ex_fair **out) {
    *out = NULL;
    if (max_items < 1 || run_slots < 1 || kv_blocks < 1) return CM_EINVAL;
    ex_fair *f = calloc(1, sizeof *f);
    if (!f) return CM_ENOMEM;
    f->tenants = calloc((size_t)max_items, sizeof *f->tenants);
    f->live = calloc((size_t)max_items, sizeof *f->live);
    f->spare = calloc((size_t)max_items, sizeof *f->spare);
    if (!f->tenants || !f->live || !f->spare) {
        ex_fair_destroy(f);
        return CM_ENOMEM;
    }
    f->max_items = max_items;
    f->inv_slots = 1.0 / run_slots;
    f->inv_blocks = 1.0 / kv_blocks;
    for (int i = 0; i < max_items; i++) f->spare[f->n_spare++] = &f->tenants[max_items - 1 - i];
    *out = f;
    return 0;
}

void ex_fair_destroy(ex_fair *f) {
    if (!f) return;
    free(f->tenants);
    free(f->live);
    free(f->spare);
    free(f);
}

/* The live tenant of id, made when absent (there is room: at most one per item). */
static ex_fair_tenant *tenant_get(ex_fair *f, uint64_t id) {
    for (int i = 0; i < f->n_live; i++)
        if (f->live[i]->id == id) return f->live[i];
    assert(f->n_spare > 0);
    ex_fair_tenant *t = f->spare[--f->n_spare];
    memset(t, 0, sizeof *t);
    t->id = id;
    t->weight = 1;
    t->live_idx = f->n_live;
    f->live[f->n_live++] = t;
    return t;
}

/* A tenant without items goes back to storage. */
static void tenant_put(ex_fair *f, ex_fair_tenant *t) {
    if (t->n_wait || t->n_run) return;
    ex_fair_tenant *last = f->live[--f->n_live];
    f->live[t->live_idx] = last;
    last->live_idx = t->live_idx;
    f->spare[f->n_spare++] = t;
}

static int key_before(const ex_fair_item *a, const ex_fair_item *b) {
    return a->priority != b->priority ? a->priority < b->priority : a->arrival < b->arrival;
}

static void list_remove(ex_fair_tenant *t, ex_fair_item *it) {
    if (it->prev) it->prev->next = it->next;
    else t->head = it->next;
    if (it->next) it->next->prev = it->prev;
    else t->tail = it->prev;
    it->prev = it->next = NULL;
}

int ex_fair_wait(ex_fair *f, ex_fair_item *it, uint64_t tenant, uint32_t weight) {
    assert(it->state != EX_FAIR_WAITING);
    ex_fair_tenant *t;
    if (it->state == EX_FAIR_RUNNING) { /* preempted: keeps its tenant and arrival */
        t = it->t;
        t->n_run--;
        t->blocks -= it->blocks;
        it->blocks = 0;
    } else {
        if (f->n_items >= f->max_items) return CM_EFULL;
        f->n_items++;
        t = tenant_get(f, tenant);
        t->weight = weight ? weight : 1;
        it->t = t;
        it->arrival = ++f->arrivals;
        it->blocks = 0;
    }
    it->state = EX_FAIR_WAITING;
    it->skip = 0;
    /* sorted insert from the tail: new arrivals of the usual priority land there at once */
    ex_fair_item *p = t->tail;
    while (p && key_before(it, p)) p = p->prev;
    it->prev = p;
    it->next = p ? p->next : t->head;
    if (it->next) it->next->prev = it;
    else t->tail = it;
    if (p) p->next = it;
    else t->head = it;
    t->n_wait++;
    f->n_wait++;
    return 0;
}

void ex_fair_run(ex_fair *f, ex_fair_item *it, int blocks) {
    assert(it->state == EX_FAIR_WAITING);
    ex_fair_tenant *t = it->t;
    list_remove(t, it);
    t->n_wait--;
    f->n_wait--;
    t->n_run++;
    t->blocks += blocks;
    it->blocks = blocks;
    it->state = EX_FAIR_RUNNING;
}

void ex_fair_set_blocks(ex_fair *f, ex_fair_item *it, int blocks) {
    (void)f;
    assert(it->state == EX_FAIR_RUNNING);
    it->t->blocks += blocks - it->blocks;
    it->blocks = blocks;
}

void ex_fair_remove(ex_fair *f, ex_fair_item *it) {
    ex_fair_tenant *t = it->t;
    if (it->state == EX_FAIR_WAITING) {
        list_remove(t, it);
        t->n_wait--;
        f->n_wait--;
    } else if (it->state == EX_FAIR_RUNNING) {
        t->n_run--;
        t->blocks -= it->blocks;
    } else {
        return;
    }
    it->state = EX_FAIR_NONE;
    it->blocks = 0;
    it->t = NULL;
    f->n_items--;
    tenant_put(f, t);
}

void ex_fair_round(ex_fair *f) {
    if (++f->round == 0) f->round = 1; /* 0 is never a round: fresh items are not skipped */
}

void ex_fair_skip(ex_fair *f, ex_fair_item *it) { it->skip = f->round; }

static double share_of(const ex_fair *f, const ex_fair_tenant *t, int add_slots, int add_blocks) {
    double s = (t->n_run + add_slots) * f->inv_slots, b = (double)(t->blocks + add_blocks) * f->inv_blocks;
    return (s > b ? s : b) / t->weight;
}

double ex_fair_share(const ex_fair *f, const ex_fair_item *it, int add_slots, int add_blocks) {
    return share_of(f, it->t, add_slots, add_blocks);
}

ex_fair_item *ex_fair_next(const ex_fair *f) {
    ex_fair_item *best = NULL;
    double best_share = 0;
    for (int i = 0; i < f->n_live; i++) {
        const ex_fair_tenant *t = f->live[i];
        ex_fair_item *it = t->head;
        while (it && it->skip == f->round) it = it->next;
        if (!it) continue;
        double sh = share_of(f, t, 0, 0);
        if (!best || it->priority < best->priority ||
            (it->priority == best->priority && (sh < best_share || (sh == best_share && it->arrival < best->arrival)))) {
            best = it;
            best_share = sh;
        }
    }
    return best;
}

int ex_fair_may_preempt(const ex_fair *f, const ex_fair_item *victim, const ex_fair_item *cand, int cand_blocks) {
    if (victim->priority != cand->priority) return victim->priority > cand->priority;
    if (victim->t == cand->t) return 0;
    return share_of(f, victim->t, 0, 0) > share_of(f, cand->t, 1, cand_blocks);
}

int ex_fair_victim_before(const ex_fair *f, const ex_fair_item *a, const ex_fair_item *b) {
    if (a->priority != b->priority) return a->priority > b->priority;
    if (a->t != b->t) {
        double sa = share_of(f, a->t, 0, 0), sb = share_of(f, b->t, 0, 0);
        if (sa != sb) return sa > sb;
    }
    return a->arrival > b->arrival;
}

int ex_fair_before(const ex_fair *f, const ex_fair_item *a, const ex_fair_item *b) {
    if (a->priority != b->priority) return a->priority < b->priority;
    if (a->t != b->t) {
        double sa = share_of(f, a->t, 0, 0), sb = share_of(f, b->t, 0, 0);
        if (sa != sb) return sa < sb;
    }
    return a->arrival < b->arrival;
}

int ex_fair_yields(const ex_fair *f, const ex_fair_item *a, const ex_fair_item *b, int far) {
    if (a->priority != b->priority) return a->priority > b->priority;
    return a->t != b->t && (far ? 2 : 1) * share_of(f, b->t, 0, 0) < share_of(f, a->t, 0, 0);
}

int ex_fair_over(const ex_fair *f, const ex_fair_item *it) {
    double sh = share_of(f, it->t, 0, 0);
    for (int i = 0; i < f->n_live; i++) {
        const ex_fair_tenant *t = f->live[i];
        if (t != it->t && t->n_run && share_of(f, t, 0, 0) < sh) return 1;
    }
    return 0;
}

int ex_fair_n_waiting(const ex_fair *f) { return f->n_wait; }

/* The first waiting item of live tenants [i, n_live), or NULL. */
static ex_fair_item *first_from(const ex_fair *f, int i) {
    for (; i < f->n_live; i++)
        if (f->live[i]->head) return f->live[i]->head;
    return NULL;
}

ex_fair_item *ex_fair_first(const ex_fair *f) { return first_from(f, 0); }

ex_fair_item *ex_fair_after(const ex_fair *f, const ex_fair_item *it) {
    return it->next ? it->next : first_from(f, it->t->live_idx + 1);
}
