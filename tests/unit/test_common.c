/* common/: error table, config precedence (file < env < CLI), logging levels, clocks. */
#include "common/cm_config.h"
#include "common/cm_err.h"
#include "common/cm_log.h"
#include "common/cm_time.h"
#include "t.h"

#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

static void test_err(void) {
    T_EQ_STR(cm_err_str(CM_ENOKV), "out of KV cache blocks");
    T_EQ_STR(cm_err_name(CM_EFORMAT), "FORMAT");
    T_EQ_STR(cm_err_str(12345), "unknown error");
    T_EQ_STR(cm_err_str(0), "ok");
}

static void test_config(void) {
    char path[] = "/tmp/arka-test-conf-XXXXXX";
    int fd = mkstemp(path);
    T_CHECK(fd >= 0);
    /* n-predict is another command's option: the shared file may name it */
    const char *text = "# comment\nthreads = 3\nkv-cache-mb = 64  # trailing\nmodel = \"/x/y.gguf\"\nn-predict = 1\n";
    T_CHECK(write(fd, text, strlen(text)) == (ssize_t)strlen(text));
    close(fd);

    int threads = 1, kv = 0, flag = 0;
    double temp = 0.5;
    const char *model = NULL;
    cm_opt opts[] = {
        { "threads", 't', CM_OPT_INT, &threads, "threads" },
        { "kv-cache-mb", 0, CM_OPT_INT, &kv, "kv" },
        { "model", 'm', CM_OPT_STR, &model, "model" },
        { "temp", 0, CM_OPT_F64, &temp, "temperature" },
        { "ids", 0, CM_OPT_BOOL, &flag, "flag" },
        { 0 },
    };
    char err[256];
    int npos;
    char **pos;
    /* file only */
    char *argv1[] = { "x", "--config", path, "pos1", NULL };
    unsetenv("ARKA_THREADS");
    T_EQ_INT(cm_config_parse(opts, 4, argv1, &npos, &pos, err, sizeof err), 0);
    T_EQ_INT(threads, 3);
    T_EQ_INT(kv, 64);
    T_EQ_STR(model, "/x/y.gguf");
    T_EQ_INT(npos, 1);
    T_EQ_STR(pos[0], "pos1");
    /* env overrides file, CLI overrides env */
    setenv("ARKA_THREADS", "5", 1);
    setenv("ARKA_KV_CACHE_MB", "128", 1);
    char *argv2[] = { "x", "--config", path, "-t", "7", "--temp=0.25", "--ids", NULL };
    T_EQ_INT(cm_config_parse(opts, 7, argv2, &npos, &pos, err, sizeof err), 0);
    T_EQ_INT(threads, 7);
    T_EQ_INT(kv, 128);
    T_NEAR(temp, 0.25, 0);
    T_EQ_INT(flag, 1);
    T_EQ_INT(npos, 0);
    unsetenv("ARKA_THREADS");
    unsetenv("ARKA_KV_CACHE_MB");
    /* a name no command takes: refused with the file and line */
    char typo[] = "/tmp/arka-test-conf-XXXXXX";
    fd = mkstemp(typo);
    T_CHECK(fd >= 0);
    const char *ttext = "threads = 2\n\nthreadz = 4\n";
    T_CHECK(write(fd, ttext, strlen(ttext)) == (ssize_t)strlen(ttext));
    close(fd);
    char *argv_typo[] = { "x", "--config", typo, NULL };
    T_EQ_INT(cm_config_parse(opts, 3, argv_typo, &npos, &pos, err, sizeof err), CM_EINVAL);
    char want[128];
    snprintf(want, sizeof want, "%s:3: unknown option 'threadz'", typo);
    T_CHECKF(strstr(err, want) != NULL, "%s", err);
    unlink(typo);
    /* errors */
    char *argv3[] = { "x", "--nope", NULL };
    T_EQ_INT(cm_config_parse(opts, 2, argv3, &npos, &pos, err, sizeof err), CM_EINVAL);
    T_CHECK(strstr(err, "--nope") != NULL);
    char *argv4[] = { "x", "--threads", "abc", NULL };
    T_EQ_INT(cm_config_parse(opts, 3, argv4, &npos, &pos, err, sizeof err), CM_EINVAL);
    T_CHECK(strstr(err, "threads") != NULL);
    char *argv5[] = { "x", "--threads", NULL };
    T_EQ_INT(cm_config_parse(opts, 2, argv5, &npos, &pos, err, sizeof err), CM_EINVAL);
    setenv("ARKA_TEMP", "hot", 1);
    char *argv6[] = { "x", NULL };
    T_EQ_INT(cm_config_parse(opts, 1, argv6, &npos, &pos, err, sizeof err), CM_EINVAL);
    T_CHECK(strstr(err, "ARKA_TEMP") != NULL);
    unsetenv("ARKA_TEMP");
    char *argv7[] = { "x", "--no-ids", NULL };
    T_EQ_INT(cm_config_parse(opts, 2, argv7, &npos, &pos, err, sizeof err), 0);
    T_EQ_INT(flag, 0);
    /* a bad line in the file names file and line */
    FILE *f = fopen(path, "w");
    fputs("threads = 2\nthis line is bad\n", f);
    fclose(f);
    T_EQ_INT(cm_config_parse(opts, 4, argv1, &npos, &pos, err, sizeof err), CM_EFORMAT);
    T_CHECK(strstr(err, ":2:") != NULL);
    char *argv8[] = { "x", "--config", "/nonexistent/arka.conf", NULL };
    T_CHECK(cm_config_parse(opts, 3, argv8, &npos, &pos, err, sizeof err) != 0);
    unlink(path);
}

/* log-level: every table takes it from file, env and CLI without declaring it. */
static void test_config_log_level(void) {
    char path[] = "/tmp/arka-test-conf-XXXXXX";
    int fd = mkstemp(path);
    T_CHECK(fd >= 0);
    const char *text = "log-level = error\n";
    T_CHECK(write(fd, text, strlen(text)) == (ssize_t)strlen(text));
    close(fd);
    int threads = 0;
    cm_opt opts[] = { { "threads", 't', CM_OPT_INT, &threads, "threads" }, { 0 } };
    char err[256];
    int npos;
    char **pos;
    unsetenv("ARKA_LOG_LEVEL");
    unsetenv("ARKA_CONFIG");

    cm_log_set_level(CM_LOG_LEVEL_INFO);
    char *a1[] = { "x", "--log-level", "debug", "-t", "2", NULL };
    T_EQ_INT(cm_config_parse(opts, 5, a1, &npos, &pos, err, sizeof err), 0);
    T_EQ_INT(cm_log_get_level(), CM_LOG_LEVEL_DEBUG);
    T_EQ_INT(threads, 2);
    T_EQ_INT(npos, 0);
    char *a2[] = { "x", "--log-level=warn", NULL };
    T_EQ_INT(cm_config_parse(opts, 2, a2, &npos, &pos, err, sizeof err), 0);
    T_EQ_INT(cm_log_get_level(), CM_LOG_LEVEL_WARN);

    /* file < env < CLI */
    cm_log_set_level(CM_LOG_LEVEL_INFO);
    char *a3[] = { "x", "--config", path, NULL };
    T_EQ_INT(cm_config_parse(opts, 3, a3, &npos, &pos, err, sizeof err), 0);
    T_EQ_INT(cm_log_get_level(), CM_LOG_LEVEL_ERROR);
    setenv("ARKA_LOG_LEVEL", "warn", 1);
    T_EQ_INT(cm_config_parse(opts, 3, a3, &npos, &pos, err, sizeof err), 0);
    T_EQ_INT(cm_log_get_level(), CM_LOG_LEVEL_WARN);
    char *a4[] = { "x", "--config", path, "--log-level", "off", NULL };
    T_EQ_INT(cm_config_parse(opts, 5, a4, &npos, &pos, err, sizeof err), 0);
    T_EQ_INT(cm_log_get_level(), CM_LOG_LEVEL_OFF);
    unsetenv("ARKA_LOG_LEVEL");
    T_EQ_INT(cm_config_set(opts, "log-level", "debug", err, sizeof err), 0);
    T_EQ_INT(cm_log_get_level(), CM_LOG_LEVEL_DEBUG);

    /* a bad value is refused from each source, naming the option (and the env variable) */
    char *a5[] = { "x", "--log-level", "loud", NULL };
    T_EQ_INT(cm_config_parse(opts, 3, a5, &npos, &pos, err, sizeof err), CM_EINVAL);
    T_CHECK(strstr(err, "log-level") != NULL && strstr(err, "loud") != NULL);
    setenv("ARKA_LOG_LEVEL", "chatty", 1);
    char *a6[] = { "x", NULL };
    T_EQ_INT(cm_config_parse(opts, 1, a6, &npos, &pos, err, sizeof err), CM_EINVAL);
    T_CHECK(strstr(err, "ARKA_LOG_LEVEL") != NULL);
    unsetenv("ARKA_LOG_LEVEL");
    FILE *f = fopen(path, "w");
    fputs("threads = 1\nlog-level = 3\n", f);
    fclose(f);
    T_EQ_INT(cm_config_parse(opts, 3, a3, &npos, &pos, err, sizeof err), CM_EINVAL);
    T_CHECK(strstr(err, ":2:") != NULL && strstr(err, "log-level") != NULL);

    /* usage lists it */
    FILE *u = tmpfile();
    T_CHECK(u != NULL);
    cm_config_usage(opts, u);
    rewind(u);
    char ubuf[2048] = { 0 };
    T_CHECK(fread(ubuf, 1, sizeof ubuf - 1, u) > 0);
    fclose(u);
    T_CHECK(strstr(ubuf, "--log-level") != NULL);
    T_CHECK(strstr(ubuf, "--config") != NULL);

    /* a table that declares log-level receives the value; the threshold stays */
    cm_log_set_level(CM_LOG_LEVEL_INFO);
    const char *own = "info";
    cm_opt opts2[] = { { "log-level", 0, CM_OPT_STR, &own, "mine" }, { 0 } };
    char *a7[] = { "x", "--log-level", "whatever", NULL };
    T_EQ_INT(cm_config_parse(opts2, 3, a7, &npos, &pos, err, sizeof err), 0);
    T_EQ_STR(own, "whatever");
    T_EQ_INT(cm_log_get_level(), CM_LOG_LEVEL_INFO);
    unlink(path);
}

static void test_log_and_time(void) {
    int lvl;
    T_EQ_INT(cm_log_parse_level("warn", &lvl), 0);
    T_EQ_INT(lvl, CM_LOG_LEVEL_WARN);
    T_EQ_INT(cm_log_parse_level("loud", &lvl), CM_EINVAL);
    int p[2];
    T_CHECK(pipe(p) == 0);
    cm_log_set_fd(p[1]);
    cm_log_set_level(CM_LOG_LEVEL_INFO);
    CM_LOG_DEBUG("test", "hidden", "x=%d", 1);
    CM_LOG_INFO("test", "shown", "x=%d y=%s", 42, "z");
    cm_log_set_fd(2);
    close(p[1]);
    char buf[1024] = { 0 };
    ssize_t n = read(p[0], buf, sizeof buf - 1);
    close(p[0]);
    T_CHECK(n > 0);
    T_CHECK(strstr(buf, "level=info mod=test msg=\"shown\" x=42 y=z\n") != NULL);
    T_CHECK(strstr(buf, "hidden") == NULL);
    uint64_t t0 = cm_time_ns();
    cm_time_sleep_ms(5);
    uint64_t dt = cm_time_ns() - t0;
    T_CHECK(dt >= 5000000 && dt < 1000000000);
}

int main(void) {
    test_err();
    test_config();
    test_config_log_level();
    test_log_and_time();
    return t_done();
}
